"""The Ray engine: one actor per subcollector (torchrl's ``RayCollector``), each node's records pulled to the
trainer, the inference server as an actor; in async mode one actor per node, each running the async loop over its rows. The names below are what the rest of topo uses (the run, the report,
the doctor); the modules are the engine's own. Importing this imports neither ray nor torch.
"""
from topo.launch.ray.async_nodes import RayAsyncEngine
from topo.launch.ray.auth import RUNBOOK as AUTH_RUNBOOK, token_required
from topo.launch.ray.engine import HINT, RayEngine, cannot_connect, check_reachable, runtime_env
from topo.launch.ray.placement import custom_resources, describe as describe_placement, here, holds, reason
from topo.launch.ray.server import RayServer, start as start_server

__all__ = ["AUTH_RUNBOOK", "HINT", "RayAsyncEngine", "RayEngine", "RayServer", "cannot_connect", "check_reachable", "custom_resources",
           "describe_placement", "here", "holds", "reason", "runtime_env", "start_server", "token_required"]
