"""The run's monitor: a thread in the trainer that reads records, sees deaths and hangs, keeps the deadlines.

Every tick it waits for deaths (pidfds of every process a record named), reads new records, shows
progress and, while the run starts or collects, asks :func:`~topo.launch.supervision.failure.decide` (and, while it
collects, :func:`~topo.launch.supervision.failure.hung` over the step heartbeats) for the first failure. It
:meth:`judges <Monitor.judge>` it: while collecting, a failure a restart cures restarts its subcollector
if the budget allows (the collector starts it again, :mod:`.respawn`); any other failure is the run's,
handed to ``on_failure`` once (:meth:`.delivery.Delivery.deliver`). Only this thread judges: what the
trainer's thread sees itself (a subcollector that ended or reported an error, and no record explains
it) it :meth:`submits <Monitor.submit>`, and the next tick judges it. The monitor goes on recording
(closes, deaths during teardown) until it is stopped.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import threading
import time
from typing import Callable

from topo.runtime import heartbeat, tracked
from topo.launch.supervision.stall_watch import StallWatch
from topo.compiler.plan import engine
from topo.launch.supervision import failure, processes, restarts
from topo.launch.supervision.progress import Progress
from topo.launch.supervision.state import Phase, RunState

TICK_S = 0.1
HANG_SCAN_S = 1.0  # heartbeats read this often (a hang is found within hang_timeout + this)
SCAN_S = {Phase.STARTING: 1.0, Phase.COLLECTING: 10.0, Phase.SHUTTING_DOWN: 1.0, Phase.DONE: 60.0}


class Monitor:
    def __init__(self, state: RunState, startup_timeout: float, progress: Progress,
                 on_failure: Callable[[failure.Failure], None]):
        self.state = state
        self.startup_timeout = startup_timeout
        self.progress = progress
        self.on_failure = on_failure
        # under Ray each actor watches its own env workers (their heartbeats are on its node: :mod:`.ray_node`)
        self.hang_timeout = None if engine(state.plan) == "ray" else state.plan["launch"].get("hang_timeout")
        self.budget = restarts.Budget(state.plan["launch"].get("restarts"))
        self.independent = (state.plan.get("collector") or {}).get("mode") == "async"  # no subcollector process: workers alone
        self.permitted: Callable[[int, int], bool | None] | None = None  # async mode: a worker may send a result
        self._free_since: dict[tuple[int, int, int], float] = {}  # (c, restart, w): seen able to send since
        self.failure: failure.Failure | None = None
        self.lock = threading.RLock()  # held while the state changes; take it to read the state consistently
        self.seen: set[int] = set()  # every pid of the run seen alive (records and environment scans)
        self.peak = 0  # most processes of the run alive at once
        self._watch = processes.DeathWatch()
        self._submitted: queue.SimpleQueue[failure.Failure] = queue.SimpleQueue()  # from the trainer's thread
        # rung at each verdict (a restart, the run's failure): the collector waits on it with its queue
        self.bell, self._ring = os.pipe()
        os.set_blocking(self._ring, False)
        os.set_blocking(self.bell, False)  # two threads may wait on it (the collector's, topo's background keeper)
        self._stop = threading.Event()
        self._last_scan = 0.0
        self._last_beats = 0.0
        self.stall = StallWatch.of(state)  # None: no launch.stall_timeout
        self._thread = threading.Thread(target=self._loop, name="topo-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then read what is left (closes and deaths up to now)."""
        self._stop.set()
        self._thread.join()
        self.tick(0)
        self._watch.close()
        os.close(self._ring)
        os.close(self.bell)

    def tick(self, wait: float) -> None:
        deaths = self._watch.wait(wait)
        with self.lock:
            state = self.state
            for death in deaths:
                state.record_death(death)
                tracked.release(state.run.path, death.pid)  # what it held in /dev/shm, unlinked at once
            state.update()
            for pid, alive_at in state.pids_to_watch():
                self._watch.add(pid, alive_at)
            self.seen |= state.known_pids()
            now = time.time()
            if now - self._last_scan >= SCAN_S[state.phase]:
                self._last_scan = now
                alive = {p.pid for p in processes.of_run(state.run.path, state.trainer_pid)}
                self.seen |= alive
                self.peak = max(self.peak, len(alive))
            if self.failure is None and state.phase in (Phase.STARTING, Phase.COLLECTING):
                found = failure.decide(state)
                if state.phase is Phase.COLLECTING:
                    stalled = self.stall.check(now) if self.stall else None
                    found = _first(found, self._hang(now), self._late_restart(now), stalled) or self._suspect()
                elif found is None and now - state.t0 > self.startup_timeout:
                    found = failure.startup_timeout(state, self.startup_timeout, now)
                if found is not None:
                    self.judge(found)
        self.progress.update(state)

    def submit(self, found: failure.Failure) -> None:
        """From another thread: a failure its records may not show; judged at the next tick unless the
        records name one first. The submitter waits for the verdict (:attr:`failure`, or a restart decided)."""
        self._submitted.put(found)
        self._ring_bell()

    def _suspect(self) -> failure.Failure | None:
        """The next submitted failure of a subcollector's current start (one a restart since replaced is moot)."""
        while True:
            try:
                found = self._submitted.get_nowait()
            except queue.Empty:
                return None
            sub = self.state.subcollectors.get(found.subcollector)
            if sub is None or (sub.restart == found.restart and not sub.pending):
                return found

    def judge(self, found: failure.Failure) -> None:
        """While collecting, restart the subcollector to blame if a restart cures it and the budget allows;
        otherwise the run fails with it. A hung process is killed first, either way. Called by this
        monitor's thread (and by unit tests that drive a monitor without its thread)."""
        with self.lock:
            if self.failure is not None:
                return
            now = time.time()
            _hang_kill(found)
            if self.state.phase is Phase.COLLECTING and found.restartable:
                if self.budget.allows(now):
                    self.budget.spend(now)
                    restarts.decide_restart(self.state, found, now)
                    self._ring_bell()
                    return
                found = dataclasses.replace(found, message=f"{found.message}; {self.budget.describe()}")
            self.failure = found
        self.on_failure(found)  # delivered before the collector is woken: it finds the failure when it looks
        self._ring_bell()

    def _ring_bell(self) -> None:
        try:
            os.write(self._ring, b"!")
        except BlockingIOError:  # rung many times already, unread
            pass

    def _hang(self, now: float) -> failure.Failure | None:
        """A step past ``hang_timeout`` (read every ``HANG_SCAN_S``), in a subcollector that collects."""
        if self.hang_timeout is None or now - self._last_beats < HANG_SCAN_S:
            return None
        self._last_beats = now
        beats, steps, free = {}, {}, {}
        for c, sub in self.state.subcollectors.items():
            if sub.local and (sub.pid or self.independent) and not sub.pending and (sub.first or sub.ready):
                slots = heartbeat.read(self.state.run.path, c, sub.restart)
                health = heartbeat.health(self.state.run.path, c, sub.restart)
                if slots:
                    beats[c], steps[c] = slots, [h.steps if h else 0 for h in health or ()]
                    if self.permitted is not None:
                        free[c] = self._free(c, sub.restart, len(slots) - 1, now)
        found = failure.hung(self.state, beats, self.hang_timeout, now, steps, self.independent, processes.stopped,
                             free or None)
        if found is not None and found.kind == "subcollector-hung":
            found = failure.stopped_in(self.state, found, processes.stopped) or found
        return found

    def _free(self, c: int, restart: int, workers: int, now: float) -> list[float | None]:
        """Since when each worker of ``c`` has been seen able to send a result, at every look (None: not now)."""
        for key in [k for k in self._free_since if k[0] == c and k[1] != restart]:
            del self._free_since[key]  # an earlier life's
        out = []
        for w in range(workers):
            key = (c, restart, w)
            if self.permitted(c, w):
                out.append(self._free_since.setdefault(key, now))
            else:
                self._free_since.pop(key, None)
                out.append(None)
        return out

    def _late_restart(self, now: float) -> failure.Failure | None:
        """A restarted subcollector not collecting ``startup_timeout`` seconds after it started."""
        late = [c for c, sub in self.state.subcollectors.items()
                if sub.began and not sub.ready and now - sub.began > self.startup_timeout]
        return failure.restart_timeout(self.state, late[0], self.startup_timeout, now) if late else None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick(TICK_S)


def _first(*found: failure.Failure | None) -> failure.Failure | None:
    """The earliest of the failures found (one without a time last)."""
    return min((f for f in found if f is not None), key=lambda f: f.at if f.at is not None else float("inf"),
               default=None)


def _hang_kill(found: failure.Failure) -> None:
    """A hang found: SIGKILL the process that hangs (a worker, or the subcollector), so that it is a death."""
    if found.kind in ("worker-hung", "subcollector-hung") and found.pid and found.host is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(found.pid, signal.SIGKILL)
