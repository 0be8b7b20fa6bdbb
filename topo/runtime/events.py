"""What the trainer decides while a run goes on, as records in its run directory (``events/``): each restart
and recycle of a subcollector as it is decided, each stall the watchdog names. ``topo top`` and
``topo runs trace`` read them while the run lives and after; the report says the same at the end.
Imports neither torch nor torchrl.
"""
from __future__ import annotations

from typing import Any

from topo.runtime.rundir import RunDir

FOLDER = "events"


def record(run: RunDir, name: str, **fields: Any) -> None:
    """Record event ``name`` (``restart``, ``recycle``, ``stall``) now: one small file, written atomically."""
    run.write(FOLDER, name, **fields)


def read(run: RunDir) -> list[dict]:
    """Every event recorded so far, oldest first."""
    return run.read_all(FOLDER)
