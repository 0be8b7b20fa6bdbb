"""The run's monitor: a thread in the trainer that reads records, sees deaths, keeps the startup deadline.

Every tick it waits for deaths (pidfds of every process a record named), reads new records, shows
progress and, while the run starts or collects, asks :func:`~topo.launch.failure.decide` for the first
failure. The first one found is handed to ``on_failure`` once; the monitor goes on recording (closes,
deaths during teardown) until it is stopped.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from . import failure, processes
from .progress import Progress
from .state import Phase, RunState

TICK_S = 0.1
SCAN_S = {Phase.STARTING: 1.0, Phase.COLLECTING: 10.0, Phase.SHUTTING_DOWN: 1.0, Phase.DONE: 60.0}


class Monitor:
    def __init__(self, state: RunState, startup_timeout: float, progress: Progress,
                 on_failure: Callable[[failure.Failure], None]):
        self.state = state
        self.startup_timeout = startup_timeout
        self.progress = progress
        self.on_failure = on_failure
        self.failure: failure.Failure | None = None
        self.lock = threading.RLock()  # held while the state changes; take it to read the state consistently
        self.seen: set[int] = set()  # every pid of the run seen alive (records and environment scans)
        self.peak = 0  # most processes of the run alive at once
        self._watch = processes.DeathWatch()
        self._stop = threading.Event()
        self._last_scan = 0.0
        self._thread = threading.Thread(target=self._loop, name="topo-monitor", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, then read what is left (closes and deaths up to now)."""
        self._stop.set()
        self._thread.join()
        self.tick(0)
        self._watch.close()

    def tick(self, wait: float) -> None:
        deaths = self._watch.wait(wait)
        with self.lock:
            state = self.state
            for death in deaths:
                state.record_death(death)
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
                if found is None and state.phase is Phase.STARTING and now - state.t0 > self.startup_timeout:
                    found = failure.startup_timeout(state, self.startup_timeout, now)
                if found is not None:
                    self.failure = found
                    self.on_failure(found)
        self.progress.update(state)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.tick(TICK_S)
