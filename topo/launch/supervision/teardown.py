"""Teardown: one deadline for everything a run started, split into stages, and one record of it.

Like torchrl's ``_shutdown_main`` (join until 80 % of the timeout, SIGTERM until 95 %, then SIGKILL), a
run's teardown has one overall deadline, ``graceful`` seconds (the plan's shutdown budget, for the
engine to close every env) plus :data:`STAGES_S`, spent in order:

1. graceful: the run's stopped processes are killed (they would close nothing), the engine shuts the collector
   down (envs closed, subcollectors joined), restarts still starting are abandoned, then the policy server gets
   ``server`` seconds;
2. exit: what is left of the run's processes (found by environment, orphans included) may exit by
   itself (a forkserver that preloaded torch takes ~2 s);
3. terminate: SIGTERM, then kill: SIGKILL;
4. watcher: told the run is over, it exits.

A stage that finds nothing to wait for takes no time; none takes longer than its share. The same
shares bound the watcher (:mod:`.watcher`, the trainer gone) and a retired subcollector (:mod:`.recovery`).
Imports neither torch nor torchrl.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from topo.launch.supervision import processes
from topo.runtime import tracked

#: seconds per stage after the graceful one
STAGES_S = {"server": 3.0, "exit": 5.0, "terminate": 3.0, "kill": 2.0, "watcher": 5.0}
SHUTDOWN_BASE_S = 10.0
SHUTDOWN_PER_WORKER_S = 5.0  # a ParallelEnv in worker-metadata mode closes its workers one at a time
RETIRED_EXIT_S = 5.0  # a retired subcollector whose workers were killed exits by itself (its writes flushed)


def shutdown_budget(plan: Mapping[str, Any], *, evaluation: bool = True) -> float:
    """Seconds the collector gets to close every env: the plan's, or sized to the largest subcollector; with
    an eval section (and ``evaluation``), plus what the eval process's run takes to end, its stages included."""
    given = plan["launch"].get("shutdown_timeout")
    largest = max(sub["num_workers"] for sub in plan["subcollectors"])
    own = float(given) if given is not None else SHUTDOWN_BASE_S + SHUTDOWN_PER_WORKER_S * largest
    section = plan.get("eval") if evaluation else None
    if not section:
        return own
    return own + shutdown_budget({"launch": plan["launch"], "subcollectors": section["subcollectors"]}) + \
        sum(STAGES_S.values())


class Deadline:
    """``graceful`` seconds, then each stage's share of :data:`STAGES_S`, against one clock."""

    def __init__(self, graceful: float):
        self.graceful = graceful
        self.started = time.monotonic()
        self.end = self.started + graceful + sum(STAGES_S.values())

    def left(self, stage: str | None = None) -> float:
        """Seconds for ``stage`` (None: the graceful one): its share, never past the overall deadline."""
        share = self.graceful if stage is None else STAGES_S[stage]
        return max(0.0, min(share, self.end - time.monotonic()))


@dataclass
class Record:
    """What teardown did, as the report reads it (times in epoch seconds)."""

    started: float | None = None
    shutdown_at: float | None = None  # the engine's shutdown began
    shutdown_done: float | None = None
    finished: float | None = None
    exit_codes: list | None = None  # each subcollector's, None where unknown
    left_behind: list[int] = field(default_factory=list)  # still running after the graceful stage
    killed: list[int] = field(default_factory=list)  # needed SIGKILL
    alive_after: list[int] = field(default_factory=list)  # still running at the end (should be none)
    watcher_exit: int | None = None


def end(procs: list, deadline: Deadline) -> list[int]:
    """SIGTERM ``procs``, the terminate share to exit, then SIGKILL; the pids that needed SIGKILL."""
    return processes.terminate(procs, deadline.left("terminate"), deadline.left("kill"))


def end_stopped(run_path: str, trainer: int) -> list[int]:
    """SIGKILL the run's stopped processes (SIGSTOP, a debugger's trap) before the graceful stage: they close
    nothing and answer no one, and a close waiting on one would spend the whole budget. The pids killed."""
    stopped = [p for p in processes.of_run(run_path, trainer) if processes.stopped(p.pid)]
    for proc in stopped:
        processes.kill(proc)
    processes.wait(stopped, STAGES_S["kill"])
    return sorted(p.pid for p in stopped)


def abort(run_path: str, trainer: int) -> list[int]:
    """End every process of the run now (a failure while it starts: torchrl's constructor then returns)."""
    return end(processes.of_run(run_path, trainer), Deadline(0.0))


def run(record: Record, deadline: Deadline, *, run_path: str, trainer: int, graceful: Callable[[Deadline], Any],
        stop_monitor: Callable[[], None], watcher) -> None:
    """The stages in order. ``graceful`` is the engine's part (collector, restarts, server); whatever it
    raises, the stages after it run, and the monitor stops before leftovers are counted."""
    record.started = time.time()
    try:
        graceful(deadline)
    finally:
        stop_monitor()
        ours = lambda: processes.of_run(run_path, trainer)  # noqa: E731
        # a forkserver serves whoever started it until that process exits, and learns of the exit only by polling
        # its pipe (seconds, on a loaded machine): the trainer's serves it until it ends, a subcollector's may
        # outlive it a while; their workers closed, every forkserver of the run is ended now, not waited for
        forkservers = [p for p in ours() if processes.is_forkserver(p)]
        record.killed += end(forkservers, deadline)
        left = processes.wait(ours(), deadline.left("exit"))
        record.left_behind = sorted(p.pid for p in left)
        record.killed += end(left, deadline)
        record.alive_after = sorted(p.pid for p in ours())
        tracked.release_all(run_path)  # what the dead registered with the tracker, before it reports it leaked
        record.watcher_exit = stop_watcher(watcher, deadline.left("watcher"))
        record.finished = time.time()


def stop_watcher(watcher, timeout: float) -> int | None:
    """Tell the watcher the run is over; its exit code (killed if it does not exit within ``timeout``)."""
    try:
        watcher.stdin.write(b"done\n")
        watcher.stdin.close()
    except OSError:
        pass
    try:
        return watcher.wait(max(timeout, 0.1))
    except Exception:  # noqa: BLE001 - a watcher that does not exit is ended here
        watcher.kill()
        return watcher.wait()
