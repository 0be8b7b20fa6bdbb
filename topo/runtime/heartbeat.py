"""Step heartbeats: which env step each worker is in, whether its subcollector owes a batch, and how
much memory each worker holds.

Each subcollector creates ``beats/sub{c}.r{k}.bin`` (``k``: its restart number) before its env workers
start: one slot per process (:data:`SLOT`). Slot 0 is the subcollector's: when a batch was last asked of
it (by the trainer) or its rollout started (by itself), when its last batch was out. Slot ``1 + w`` is
worker ``w``'s: when its current env step or reset started, when its last one ended. A stamp is an
8-byte store into a shared mapping, no system call: it costs nothing next to an env step. The monitor
reads the file (:func:`read`) to find a step that never returns, or a subcollector that collects without
stepping (:func:`topo.launch.supervision.failure.hung`).

A worker's slot also holds its resident memory (:func:`resident`: VmRSS and VmHWM, the peak, from
``/proc/self/status``), its pid and when they were read: after its env is built, at the end of a step or
reset at most every :data:`MEMORY_EVERY_S` seconds (one read of a small file, ~20 us: nothing next to
a second of steps), and when its env is closed (the peak is then the worker's whole life). The trainer
reads them with :func:`memory`.

It holds how the worker's steps go too (:func:`health`), for health budgets (``launch.recycle``): steps
since its env was built, an exponentially weighted mean of their durations (:data:`EWMA_ALPHA`; a sample
counts at most :data:`EWMA_CLIP` times the mean, so that one descheduling does not look like a slowdown),
its baseline (the mean of its first :data:`BASELINE_STEPS` steps), and its resets (episodes begun): a few
8-byte stores after each step, no system call. Imports neither torch nor torchrl.

Past those figures (:data:`TIMED`) each slot times one kind of call for :mod:`topo.runtime.time_breakdown`: a worker's
env steps, a subcollector's policy calls (:func:`policy_call`): their count, total seconds and histogram.

Then (:data:`ENV_STEPS`), a worker's env steps as its base env took them: under an ``env.transforms`` stack with
``MultiAction`` a step of the worker (a decision) is up to a chunk of env steps, each counted where it runs, not
computed. With the stack over the subcollector's ``ParallelEnv`` (``transforms_at: subcollector``) the workers see
env steps only: the subcollector's slot counts the decisions (:func:`decisions`).

Last (:data:`WAITS`), in async mode, where each env worker's own loop asks the inference server between its
steps (:func:`inference_in_worker`): each wait, from the end of its step or reset to the start of its next step.
"""
from __future__ import annotations

import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Any

from topo.runtime import time_breakdown
from topo.runtime.rundir import RunDir, restart_number

#: (started, ended, memory read at, pid, rss bytes, peak rss bytes, steps, step mean s, baseline s, resets)
SLOT = struct.Struct("=dddqqqqddq")
MEMORY = struct.Struct("=dqqq")  # the memory part of a slot, at offset 16
STEPS = struct.Struct("=qdd")  # steps, their weighted mean duration, the baseline: at offset 48
RESETS = struct.Struct("=q")  # at offset 72
TIMED = struct.Struct(f"=qd{time_breakdown.BUCKETS}I")  # calls, their seconds, their histogram: at SLOT.size
ENV_STEPS = struct.Struct("=q")  # a worker's env steps (a chunk's each), a subcollector's decisions: after TIMED
WAITS = TIMED  # an async worker's waits for inference, after ENV_STEPS
WAITS_AT = SLOT.size + TIMED.size + ENV_STEPS.size
STRIDE = WAITS_AT + WAITS.size  # one process's slot in a beats file
MEMORY_EVERY_S = 1.0  # a worker reads its memory at most this often while it steps
BASELINE_STEPS = 50  # a worker's baseline step duration: the mean of its first steps
EWMA_ALPHA = 0.05  # weight of the latest step in the mean (about the last 40 steps)
EWMA_CLIP = 4.0  # a step counts at most this many times the mean
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


@dataclass(frozen=True)
class Health:
    """One worker's figures for health budgets: memory as last read, its steps' durations (seconds), resets."""

    pid: int
    rss: int  # bytes; 0: not read yet
    steps: int
    latency: float  # the weighted mean of its steps' durations
    baseline: float | None  # the mean of its first BASELINE_STEPS steps (None until it ran them)
    resets: int  # episodes begun

    @property
    def drift(self) -> float | None:
        """Its steps' mean duration now over its baseline (None before the baseline, or a zero one)."""
        return self.latency / self.baseline if self.baseline else None


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


FOLDER = "beats"  # a run directory's beats files: written through memory maps, so their mtime lags their content


def path(run_dir: str, subcollector: int, restart: int) -> str:
    return os.path.join(run_dir, FOLDER, f"sub{subcollector}.r{restart}.bin")


class Stamp:
    """One slot of a beats file, mapped in this process; ``memory``: its ends also record this process's
    memory (at most every :data:`MEMORY_EVERY_S`)."""

    def __init__(self, file: str, slot: int, memory: bool = False):
        with open(file, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        self._at = slot * STRIDE
        self.records_memory = memory
        self._next_memory = 0.0 if memory else float("inf")
        self._started = self._mean = self._baseline = 0.0
        self._steps = self._resets = self._calls = self._env_steps = self._waits = 0
        self._seconds = self._waited = self._ended = 0.0
        self.waiting = False  # its steps' starts time the wait since its last end (:func:`inference_in_worker`)

    def close(self) -> None:
        """Unmap the file (and close the descriptor the map holds)."""
        self._map.close()

    def start(self) -> None:
        self._started = time.time()
        struct.pack_into("=d", self._map, self._at, self._started)

    def start_step(self) -> None:
        """:meth:`start` of an env step; a waiting worker's wait since its last end, timed (:data:`WAITS`)."""
        self.start()
        if self.waiting and self._ended:
            seconds = self._started - self._ended
            self._waits += 1
            self._waited += seconds
            struct.pack_into("=qd", self._map, self._at + WAITS_AT, self._waits, self._waited)
            at = self._at + WAITS_AT + 16 + 4 * time_breakdown.bucket(seconds)
            struct.pack_into("=I", self._map, at, struct.unpack_from("=I", self._map, at)[0] + 1)

    def end(self) -> float:
        now = self._ended = time.time()
        struct.pack_into("=d", self._map, self._at + 8, now)
        if now >= self._next_memory:
            self.memory(now)
        return now

    def end_step(self) -> None:
        """:meth:`end` of an env step: its count, the weighted mean and (over the first steps) the baseline."""
        seconds = self.end() - self._started
        self.timed(seconds)
        self._steps += 1
        if self._steps <= BASELINE_STEPS:
            self._baseline += (seconds - self._baseline) / self._steps
            self._mean = self._baseline
        else:
            self._mean += EWMA_ALPHA * (min(seconds, EWMA_CLIP * self._mean) - self._mean)
        STEPS.pack_into(self._map, self._at + 48, self._steps, self._mean, self._baseline)

    def env_steps(self, n: int = 1) -> None:
        """``n`` more env steps (a worker's) or decisions (a subcollector's, :func:`decisions`)."""
        self._env_steps += n
        ENV_STEPS.pack_into(self._map, self._at + SLOT.size + TIMED.size, self._env_steps)

    def timed(self, seconds: float) -> None:
        """One more call of this slot's kind (:data:`TIMED`), of ``seconds``."""
        self._calls += 1
        self._seconds += seconds
        struct.pack_into("=qd", self._map, self._at + SLOT.size, self._calls, self._seconds)
        at = self._at + SLOT.size + 16 + 4 * time_breakdown.bucket(seconds)
        struct.pack_into("=I", self._map, at, struct.unpack_from("=I", self._map, at)[0] + 1)

    def end_reset(self) -> None:
        """:meth:`end` of a reset: one more episode begun."""
        self.end()
        self._resets += 1
        RESETS.pack_into(self._map, self._at + 72, self._resets)

    def memory(self, now: float | None = None) -> None:
        """Record this process's memory now (and not again before :data:`MEMORY_EVERY_S`)."""
        now = time.time() if now is None else now
        self._next_memory = now + MEMORY_EVERY_S
        found = resident()
        if found is not None:
            MEMORY.pack_into(self._map, self._at + 16, now, os.getpid(), *found)


def open_subcollector(run: RunDir, index: int, workers: int) -> None:
    """In a subcollector, before its workers start: a zeroed beats file (replacing none: one per restart)."""
    file = create(run.path, index, restart_number(), workers)
    _mine.update(stamp=Stamp(file, 0), pid=os.getpid())


def create(run_dir: str, subcollector: int, restart: int, workers: int) -> str:
    """A zeroed beats file for a subcollector and its ``workers`` (slot 0 and one slot each); its path."""
    file = path(run_dir, subcollector, restart)
    os.makedirs(os.path.dirname(file), exist_ok=True)
    tmp = f"{file}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(bytes(STRIDE * (1 + workers)))
    os.replace(tmp, file)
    return file


def asker(run_dir: str, subcollector: int, restart: int) -> Stamp | None:
    """In the trainer: slot 0 of a subcollector's beats file, stamped when a batch is asked of it."""
    file = path(run_dir, subcollector, restart)
    return Stamp(file, 0) if os.path.exists(file) else None


def inference_in_worker() -> None:
    """In an async env worker, before its env is built: its loop asks the inference itself, so :func:`watch` times
    its waits between steps (:data:`WAITS`)."""
    _mine["waits"] = True


def policy_call(seconds: float) -> None:
    """The subcollector's policy answered a call in ``seconds`` (its slot 0's :data:`TIMED`)."""
    if "stamp" in _mine and _mine.get("pid") == os.getpid():
        _mine["stamp"].timed(seconds)


def collecting() -> None:
    """The subcollector starts a rollout (torchrl's ``pre_collect_hook``)."""
    if "stamp" in _mine:
        _mine["stamp"].start()


def delivered() -> None:
    """The subcollector's batch is out (its ``post_collect_hook``)."""
    if "stamp" in _mine:
        _mine["stamp"].end()


def decisions(env: Any) -> None:
    """In a subcollector whose ``ParallelEnv`` is under the stack: its decisions in its slot 0, one per worker at
    each step of ``env`` (the transformed ``ParallelEnv``: every worker decides at each of its steps)."""
    if "stamp" not in _mine:
        return
    from topo.runtime.transforms import count_steps

    workers = int(env.batch_size.numel())
    count_steps(env, lambda: _mine["stamp"].env_steps(workers))


def watch(env: Any, run: RunDir, worker: dict, base: Any = None) -> None:
    """In an env worker: stamp its slot around every ``_step`` and ``_reset``, and its memory now, while it
    steps and at ``close`` (instance attributes, no subclass); count ``base``'s steps as its env steps (the env
    under ``env``'s transforms; None: ``env`` itself). An env its subcollector builds for itself
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
    from topo.runtime.transforms import count_steps

    stamp.waiting = bool(_mine.get("waits"))
    env._step = _stamped(stamp.start_step, env._step, stamp.end_step)
    env._reset = _stamped(stamp.start, env._reset, stamp.end_reset)
    count_steps(env if base is None else base, stamp.env_steps)


def _stamped(start: Any, call: Any, end: Any) -> Any:
    """``call`` with ``start`` before it and ``end`` (a step's or a reset's) after it, whatever happens."""
    def stamped(*args: Any, **kwargs: Any) -> Any:
        start()
        try:
            return call(*args, **kwargs)
        finally:
            end()

    return stamped


def _slots(run_dir: str, subcollector: int, restart: int, layout: struct.Struct = SLOT,
           offset: int = 0) -> list[tuple] | None:
    try:
        with open(path(run_dir, subcollector, restart), "rb") as f:
            data = f.read()
    except OSError:
        return None
    return [layout.unpack_from(data, i + offset) for i in range(0, len(data) - STRIDE + 1, STRIDE)]


def timed(run_dir: str, subcollector: int, restart: int) -> list[time_breakdown.Timed] | None:
    """Each slot's timed calls (index 0: the subcollector's policy calls; ``1 + w``: worker ``w``'s env steps)
    from a subcollector's beats file, or None while it does not exist."""
    slots = _slots(run_dir, subcollector, restart, TIMED, SLOT.size)
    return None if slots is None else [time_breakdown.Timed(calls, seconds, tuple(histogram))
                                       for calls, seconds, *histogram in slots]


def waits(run_dir: str, subcollector: int, restart: int) -> list[time_breakdown.Timed] | None:
    """Each slot's waits for inference (:data:`WAITS`: async workers' only; index ``1 + w``: worker ``w``), or None
    while the beats file does not exist."""
    slots = _slots(run_dir, subcollector, restart, WAITS, WAITS_AT)
    return None if slots is None else [time_breakdown.Timed(calls, seconds, tuple(histogram))
                                       for calls, seconds, *histogram in slots]


def steps(run_dir: str, subcollector: int, restart: int) -> tuple[list[int], list[int]] | None:
    """(each slot's steps, each slot's :data:`ENV_STEPS`) of a subcollector's beats file (index 0 its own: no steps,
    its decisions under a subcollector stack; ``1 + w`` worker ``w``'s), or None while it does not exist."""
    slots, counts = _slots(run_dir, subcollector, restart), _slots(run_dir, subcollector, restart, ENV_STEPS,
                                                                    SLOT.size + TIMED.size)
    if slots is None or counts is None:
        return None
    return [slot[6] for slot in slots], [n for n, in counts]


def read(run_dir: str, subcollector: int, restart: int) -> list[tuple[float, float]] | None:
    """Every slot's (started, ended) of a beats file, or None while it does not exist."""
    slots = _slots(run_dir, subcollector, restart)
    return None if slots is None else [slot[:2] for slot in slots]


def waiting_on(slots: list[tuple[float, float]], steps: list[int], timeout: float, now: float,
               independent: bool = False, free: list[float | None] | None = None) -> dict[int, float] | None:
    """What hangs in a subcollector, from its heartbeat ``slots`` (slot 0 the rollout's
    (asked, delivered), slot ``w + 1`` worker ``w``'s step (started, ended)) and its workers' ``steps``: None
    when nothing does; else the workers to blame, each with how long the rollout has waited on it. Those in a
    step or reset started more than ``timeout`` ago; or, when the rollout is owed and no worker stepped for
    ``timeout``, those the step waits on: fewer steps than the others (the workers of a ``ParallelEnv`` step
    together; one stopped before it could stamp its step shows so). An empty dict: the rollout is owed and
    waits on no worker (the collector itself hangs). ``independent`` workers (async mode: each steps on its own,
    the trainer owes the batch): while it is owed, each that has not stepped for ``timeout``, the trainer's last
    hold of a batch left out (a worker may wait for result permits meanwhile); and, whether it is owed or not, each
    idle for ``timeout`` since it was last seen able to send a result (``free[w]``: since when it has had a permit,
    None: it has none): siblings may feed the trainer while it never steps again."""
    asked, delivered = slots[0]
    workers = slots[1:]
    busy = {i: now - started for i, (started, ended) in enumerate(workers) if started > ended}
    late = {i: seconds for i, seconds in busy.items() if seconds > timeout}
    if late or busy and not independent:
        return late or None
    if independent:
        idle = {}
        for i, (started, ended) in enumerate(workers):
            if started > ended:
                continue
            waited = [now - ended - max(0.0, asked - max(delivered, ended))] if asked > delivered else []
            since = free[i] if free is not None and i < len(free) else None
            if since is not None:
                waited.append(now - max(ended, since))
            if waited and max(waited) > timeout:
                idle[i] = max(waited)
        return idle or None
    last = max([asked, *(ended for _, ended in workers)])
    if asked <= delivered or now - last <= timeout:
        return None
    most = max(steps, default=0)
    return {i: now - last for i, n in enumerate(steps[:len(workers)]) if n < most}


def memory(run_dir: str, subcollector: int, restart: int) -> list[Memory | None] | None:
    """Each worker's latest memory (index ``w`` for worker ``w``; None: not read yet) from a subcollector's
    beats file, or None while it does not exist. Cheap (one small file read): a trainer may call it often."""
    slots = _slots(run_dir, subcollector, restart)
    if slots is None:
        return None
    return [Memory(pid, rss, peak, at) if pid else None for _, _, at, pid, rss, peak, *_ in slots[1:]]


def health(run_dir: str, subcollector: int, restart: int) -> list[Health | None] | None:
    """Each worker's :class:`Health` (index ``w`` for worker ``w``; None: its env not built yet) from a
    subcollector's beats file, or None while it does not exist. One small file read."""
    slots = _slots(run_dir, subcollector, restart)
    if slots is None:
        return None
    return [Health(pid, rss, steps, mean, baseline if steps >= BASELINE_STEPS else None, resets) if ended else None
            for _, ended, _, pid, rss, _, steps, mean, baseline, resets in slots[1:]]
