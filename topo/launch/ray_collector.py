"""The Ray engine: torchrl's ``RayCollector``, one remote collector (a Ray actor) per subcollector.

Each actor runs a single ``Collector`` over the same worker-metadata ``ParallelEnv`` a local
subcollector builds (:func:`topo.launch.local.subcollector_env`): the actor builds no env, its env
workers are processes it spawns. :meth:`RayEngine.check` imports no torch (the CLI runs it before
anything starts); :meth:`RayEngine.build` and :meth:`RayEngine.shutdown` run in the trainer.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import os
import socket
import time
from typing import Any, Iterator

from .. import gl
from ..errors import LaunchError
from ..rundir import RUN_DIR_VAR, SLOTS_VAR

CONNECT_TIMEOUT_S = 5.0
HINT = ("start a cluster with `ray start --head` (other nodes join with `ray start --address=HEAD:6379`), "
        "or set placement.address")


def check_reachable(placement: dict[str, Any]) -> None:
    """Raise :class:`LaunchError` if ray is not installed, or a ``host:port`` address refuses a TCP connection."""
    if importlib.util.find_spec("ray") is None:
        raise LaunchError("placement engine 'ray' needs ray on this machine: pip install 'topo[ray]'")
    address = placement["address"]
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not (host and port.isdigit()):
        return  # e.g. 'auto': ray.init resolves it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise LaunchError(f"no Ray cluster at {address} ({err}): {HINT}") from None


def runtime_env(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan's runtime_env, plus topo's package (so actors run this topo) and the ``TOPO_*`` env vars.

    Actors hold GL off as the collector process does (:mod:`topo.gl`): ``MUJOCO_GL`` from the
    runtime_env, else this process's, is what their env workers get back.
    ``TOPO_RUN_DIR`` reaches the actors and, inherited, their env workers: their markers land in the
    run directory when it is on a filesystem they share with this machine. It is made absolute: an
    actor's working directory is Ray's, not this process's.
    """
    env = copy.deepcopy(plan["placement"]["runtime_env"])
    ours = {var: os.environ[var] for var in (RUN_DIR_VAR, SLOTS_VAR) if os.environ.get(var)}
    if RUN_DIR_VAR in ours:
        ours[RUN_DIR_VAR] = os.path.abspath(ours[RUN_DIR_VAR])
    given = env.get("env_vars", {})
    ours.update(gl.held_env(given.get("MUJOCO_GL", gl.users_setting())))  # actors import torchrl with GL held
    env["env_vars"] = {**given, **ours}
    package = os.path.dirname(importlib.util.find_spec("topo").origin)
    env["py_modules"] = [*env.get("py_modules", []), package]
    return env


class RayTopology:
    """A ``RayCollector`` iterated up to the plan's ``total_frames`` (-1: no end).

    torchrl's ``RayCollector`` yields nothing for ``total_frames=-1`` and, when it reaches its
    total, kills its actors before their envs close: it gets no total, and this stops instead.
    """

    def __init__(self, collector, total_frames: int):
        self.collector = collector
        self.total_frames = total_frames

    def __iter__(self) -> Iterator[Any]:
        frames = 0
        for batch in self.collector:
            yield batch
            frames += batch.numel()
            if 0 < self.total_frames <= frames:
                return


class RayEngine:
    """The plan's subcollectors as Ray actors, reached through the cluster at ``placement.address``."""

    name = "ray"
    capabilities: frozenset[str] = frozenset()  # Ray restarts actors itself; each actor keeps its factory's weights

    def check(self, plan: dict[str, Any]) -> None:
        check_reachable(plan["placement"])

    def build(self, plan: dict[str, Any], **kwargs: Any) -> RayTopology:
        """Connect to the plan's cluster, then a ``RayCollector`` whose actors hold their resources and built envs.

        ``ray.init`` runs here, not in ``RayCollector``, so that a failure names the address; the actors'
        envs are built when this returns (RayCollector waits on every actor before it returns).
        Sync: each actor collects ``frames_per_batch / subcollectors`` frames and the batch stacks them;
        async: each batch is one actor's ``frames_per_batch``, as with the local multi collectors.
        """
        import ray
        from torchrl.collectors import Collector
        from torchrl.collectors.distributed import RayCollector

        from .local import env_factories

        placement = plan["placement"]
        try:
            ray.init(address=placement["address"], runtime_env=runtime_env(plan), log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            reason = str(err).rstrip(".")
            raise LaunchError(f"cannot connect to the Ray cluster at {placement['address']!r}: {reason}; {HINT}") from None
        collector = RayCollector(
            env_factories(plan),
            frames_per_batch=plan["collector"]["frames_per_batch"],
            total_frames=math.inf,
            sync=plan["collector"]["sync"],
            collector_class=Collector,  # one env per actor: its ParallelEnv (no extra process layer)
            remote_configs=[sub["remote_config"] for sub in placement["subcollectors"]],
            **kwargs,
        )
        return RayTopology(collector, plan["collector"]["total_frames"])

    def supervise(self, topology: RayTopology, recovery) -> None:
        """Nothing: Ray restarts actors itself (``launch.restarts`` and ``hang_timeout`` need the local engine)."""

    def shutdown(self, topology: RayTopology, timeout: float) -> list[None]:
        """Close every actor's env, then end the actors and disconnect, within ``timeout`` seconds overall.

        ``RayCollector.shutdown`` only kills the actors (no env ``close()`` would run): each actor's own
        collector shuts down first. Actors have no exit code: one ``None`` per subcollector.
        """
        import ray

        deadline = time.monotonic() + timeout
        actors = list(topology.collector.remote_collectors)
        closing = [actor.cascade_execute.remote("shutdown", raise_on_error=False) for actor in actors]
        ray.wait(closing, num_returns=len(closing), timeout=timeout)
        topology.collector.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        ray.shutdown()
        return [None] * len(actors)
