"""Step heartbeats: which env step each worker is in, and whether its subcollector owes a batch.

Each subcollector creates ``beats/sub{c}.r{k}.bin`` (``k``: its restart number) before its env workers
start: one slot per process, two float64 timestamps each. Slot 0 is the subcollector's: when a batch
was last asked of it (by the trainer) or its rollout started (by itself), when its last batch was out.
Slot ``1 + w`` is worker ``w``'s: when its current env step or reset started, when its last one ended. A stamp is an 8-byte store into a shared mapping, no
system call: it costs nothing next to an env step. The monitor reads the file (:func:`read`) to find a
step that never returns, or a subcollector that collects without stepping (:func:`topo.launch.failure.hung`).
Imports neither torch nor torchrl.
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from typing import Any

from .rundir import RunDir, restart_number

SLOT = struct.Struct("=dd")  # (started, ended)
_mine: dict[str, Any] = {}  # in a subcollector process: its own stamp


def path(run_dir: str, subcollector: int, restart: int) -> str:
    return os.path.join(run_dir, "beats", f"sub{subcollector}.r{restart}.bin")


class Stamp:
    """One slot of a beats file, mapped in this process."""

    def __init__(self, file: str, slot: int):
        with open(file, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        self._at = slot * SLOT.size

    def start(self) -> None:
        struct.pack_into("=d", self._map, self._at, time.time())

    def end(self) -> None:
        struct.pack_into("=d", self._map, self._at + 8, time.time())


def open_subcollector(run: RunDir, index: int, workers: int) -> None:
    """In a subcollector, before its workers start: a zeroed beats file (replacing none: one per restart)."""
    file = path(run.path, index, restart_number())
    os.makedirs(os.path.dirname(file), exist_ok=True)
    tmp = f"{file}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(bytes(SLOT.size * (1 + workers)))
    os.replace(tmp, file)
    _mine["stamp"] = Stamp(file, 0)


def asker(run_dir: str, subcollector: int, restart: int) -> Stamp | None:
    """In the trainer: slot 0 of a subcollector's beats file, stamped when a batch is asked of it."""
    file = path(run_dir, subcollector, restart)
    return Stamp(file, 0) if os.path.exists(file) else None


def collecting() -> None:
    """The subcollector starts a rollout (torchrl's ``pre_collect_hook``)."""
    if "stamp" in _mine:
        _mine["stamp"].start()


def delivered() -> None:
    """The subcollector's batch is out (its ``post_collect_hook``)."""
    if "stamp" in _mine:
        _mine["stamp"].end()


def watch(env: Any, run: RunDir, worker: dict) -> None:
    """In an env worker: stamp its slot around every ``_step`` and ``_reset`` (instance attributes, no subclass)."""
    file = path(run.path, worker.get("subcollector", -1), restart_number())
    if not os.path.exists(file):  # a subcollector that keeps no beats (topo bench's legacy constructions)
        return
    stamp = Stamp(file, 1 + worker["index"])
    stamp.end()
    for name in ("_step", "_reset"):
        original = getattr(env, name)

        def stamped(*args: Any, _original=original, **kwargs: Any) -> Any:
            stamp.start()
            try:
                return _original(*args, **kwargs)
            finally:
                stamp.end()

        setattr(env, name, stamped)


def read(run_dir: str, subcollector: int, restart: int) -> list[tuple[float, float]] | None:
    """Every slot of a beats file, or None while it does not exist."""
    try:
        with open(path(run_dir, subcollector, restart), "rb") as f:
            data = f.read()
    except OSError:
        return None
    return [SLOT.unpack_from(data, i) for i in range(0, len(data) - SLOT.size + 1, SLOT.size)]
