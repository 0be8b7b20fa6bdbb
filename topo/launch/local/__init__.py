"""The local engine: torchrl's multi-process collectors on this machine, able to restart a subcollector in place.
:class:`LocalEngine` is what the rest of topo uses; the modules are the engine's own."""
from topo.launch.local.engine import LocalEngine

__all__ = ["LocalEngine"]
