"""``collector.mode: async``: one torchrl ``AsyncBatchedCollector`` over every plan row (:mod:`.engine`), its slots
from the backend's declared layout (:mod:`.slots`), its env workers started again from their rows (:mod:`.respawn`)."""
from topo.launch.async_mode.engine import AsyncEngine, ServedPlacement

__all__ = ["AsyncEngine", "ServedPlacement"]
