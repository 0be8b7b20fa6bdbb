"""Step heartbeats: which env step each worker is in, whether its subcollector owes a batch, and how
much memory each worker holds.

Each subcollector creates ``beats/sub{c}.r{k}.bin`` (``k``: its restart number) before its env workers
start: one slot per process (:data:`SLOT`). Slot 0 is the subcollector's: when a batch was last asked of
it (by the trainer) or its rollout started (by itself), when its last batch was out. Slot ``1 + w`` is
worker ``w``'s: when its current env step or reset started, when its last one ended. A stamp is an
8-byte store into a shared mapping, no system call: it costs nothing next to an env step. The monitor
reads the file (:func:`read`) to find a step that never returns, or a subcollector that collects without
stepping (:func:`topo.launch.failure.hung`).

A worker's slot also holds its resident memory (:func:`resident`: VmRSS and VmHWM, the peak, from
``/proc/self/status``), its pid and when they were read: after its env is built, at the end of a step or
reset at most every :data:`MEMORY_EVERY_S` seconds (one read of a small file, ~20 us: nothing next to
a second of steps), and when its env is closed (the peak is then the worker's whole life). The trainer
reads them with :func:`memory`. Imports neither torch nor torchrl.
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

from .rundir import RunDir, restart_number

SLOT = struct.Struct("=dddqqq")  # (started, ended, memory read at, pid, rss bytes, peak rss bytes)
MEMORY = struct.Struct("=dqqq")  # the memory part of a slot, at offset 16
MEMORY_EVERY_S = 1.0  # a worker reads its memory at most this often while it steps
_mine: dict[str, Any] = {}  # in a subcollector process: its own stamp, and its pid


@dataclass(frozen=True)
class Memory:
    """One worker's resident memory as it last read it: ``rss`` now, ``peak`` (its high-water mark), in bytes."""

    pid: int
    rss: int
    peak: int
    at: float  # time.time() of the reading

    @property
    def rss_mb(self) -> float:
        return round(self.rss / 2**20, 1)

    @property
    def peak_rss_mb(self) -> float:
        return round(self.peak / 2**20, 1)


def resident(status: str = "/proc/self/status") -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of this process in bytes; None where the kernel shows neither (not Linux)."""
    try:
        with open(status, "rb") as f:
            text = f.read()
    except OSError:
        return None
    found = {}
    for line in text.splitlines():
        if line.startswith((b"VmRSS:", b"VmHWM:")):
            found[line[:5]] = int(line.split()[1]) * 1024  # in kB
    return (found[b"VmRSS"], found[b"VmHWM"]) if len(found) == 2 else None


def path(run_dir: str, subcollector: int, restart: int) -> str:
    return os.path.join(run_dir, "beats", f"sub{subcollector}.r{restart}.bin")


class Stamp:
    """One slot of a beats file, mapped in this process; ``memory``: its ends also record this process's
    memory (at most every :data:`MEMORY_EVERY_S`)."""

    def __init__(self, file: str, slot: int, memory: bool = False):
        with open(file, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        self._at = slot * SLOT.size
        self.records_memory = memory
        self._next_memory = 0.0 if memory else float("inf")

    def start(self) -> None:
        struct.pack_into("=d", self._map, self._at, time.time())

    def end(self) -> None:
        now = time.time()
        struct.pack_into("=d", self._map, self._at + 8, now)
        if now >= self._next_memory:
            self.memory(now)

    def memory(self, now: float | None = None) -> None:
        """Record this process's memory now (and not again before :data:`MEMORY_EVERY_S`)."""
        now = time.time() if now is None else now
        self._next_memory = now + MEMORY_EVERY_S
        found = resident()
        if found is not None:
            MEMORY.pack_into(self._map, self._at + 16, now, os.getpid(), *found)


def open_subcollector(run: RunDir, index: int, workers: int) -> None:
    """In a subcollector, before its workers start: a zeroed beats file (replacing none: one per restart)."""
    file = path(run.path, index, restart_number())
    os.makedirs(os.path.dirname(file), exist_ok=True)
    tmp = f"{file}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(bytes(SLOT.size * (1 + workers)))
    os.replace(tmp, file)
    _mine.update(stamp=Stamp(file, 0), pid=os.getpid())


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
    """In an env worker: stamp its slot around every ``_step`` and ``_reset``, and its memory now, while it
    steps and at ``close`` (instance attributes, no subclass). An env its subcollector builds for itself
    (torchrl's default metadata, topo bench's ``legacy``) stamps no memory: the figures are the worker's."""
    file = path(run.path, worker.get("subcollector", -1), restart_number())
    if not os.path.exists(file):  # no beats file for this subcollector
        return
    stamp = Stamp(file, 1 + worker["index"], memory=_mine.get("pid") != os.getpid())
    stamp.end()
    if stamp.records_memory:
        close = env.close

        def closing(*args: Any, **kwargs: Any) -> Any:
            stamp.memory()  # the peak now is the worker's whole life
            return close(*args, **kwargs)

        env.close = closing
    for name in ("_step", "_reset"):
        original = getattr(env, name)

        def stamped(*args: Any, _original=original, **kwargs: Any) -> Any:
            stamp.start()
            try:
                return _original(*args, **kwargs)
            finally:
                stamp.end()

        setattr(env, name, stamped)


def _slots(run_dir: str, subcollector: int, restart: int) -> list[tuple] | None:
    try:
        with open(path(run_dir, subcollector, restart), "rb") as f:
            data = f.read()
    except OSError:
        return None
    return [SLOT.unpack_from(data, i) for i in range(0, len(data) - SLOT.size + 1, SLOT.size)]


def read(run_dir: str, subcollector: int, restart: int) -> list[tuple[float, float]] | None:
    """Every slot's (started, ended) of a beats file, or None while it does not exist."""
    slots = _slots(run_dir, subcollector, restart)
    return None if slots is None else [slot[:2] for slot in slots]


def memory(run_dir: str, subcollector: int, restart: int) -> list[Memory | None] | None:
    """Each worker's latest memory (index ``w`` for worker ``w``; None: not read yet) from a subcollector's
    beats file, or None while it does not exist. Cheap (one small file read): a trainer may call it often."""
    slots = _slots(run_dir, subcollector, restart)
    if slots is None:
        return None
    return [Memory(pid, rss, peak, at) if pid else None for _, _, at, pid, rss, peak in slots[1:]]
