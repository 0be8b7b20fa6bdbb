"""The startup supervisor: runs a plan's collector process and watches it start, collect and stop.

The top process never imports torch. It starts :mod:`topo.launch.runner` in a new session, reads
markers and events from the run directory, and ends the launch on the first of: a worker whose
builder raised, a worker or subcollector that died, the startup deadline, a collector failure,
SIGINT, SIGTERM or SIGHUP. Teardown always runs: the collector process closes its envs within the
shutdown budget, then whatever topo started and is still alive (by pid and by process group) gets
SIGTERM, then SIGKILL.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ..errors import Interrupted, LaunchError, TopoError
from . import processes
from .markers import RUN_DIR_VAR, SLOTS_VAR, RunDir
from .plans import shutdown_budget
from .progress import Progress
from .state import LaunchState, Phase, Worker

TICK_S = 0.1
STOP_GRACE_S = 5.0  # for the collector process to exit, beyond its shutdown budget
LEFTOVER_GRACE_S = 2.0  # processes left once the collector process is gone: time to exit on their own
TERM_GRACE_S = 3.0  # then SIGTERM, this long, then SIGKILL
SUBCOLLECTOR_GRACE_S = 2.0  # time for the error a dead subcollector sent to reach the collector process


@dataclass
class Options:
    batches: int = 1
    startup_timeout: float | None = None  # overrides the plan's
    max_concurrent_starts: int | None = None  # overrides the plan's
    progress: bool = True
    report_dir: str | None = None  # holds the run directory (kept); else a temporary one
    command: dict = field(default_factory=dict)  # argv and cwd, for the report


@dataclass
class Outcome:
    """What a launch did; :mod:`topo.launch.report` turns it into the summary."""

    state: LaunchState
    options: Options
    startup_timeout: float
    shutdown_budget: float
    max_concurrent_starts: int | None
    error: TopoError | None = None
    runner_exit_code: int | None = None
    left_behind: list[int] = field(default_factory=list)  # alive after the collector process exited
    killed: list[int] = field(default_factory=list)  # of those, needed SIGKILL
    alive_after: list[int] = field(default_factory=list)
    teardown_started: float | None = None
    finished: float | None = None


def launch(plan: dict, options: Options) -> Outcome:
    """Run ``plan`` to completion or failure; everything it started is gone when this returns."""
    launch_cfg = plan["launch"]
    if options.report_dir:
        os.makedirs(options.report_dir, exist_ok=True)
    run_dir = tempfile.mkdtemp(prefix="topo-run-", dir=options.report_dir)
    outcome = Outcome(
        state=LaunchState(plan, RunDir(run_dir), time.time()),
        options=options,
        startup_timeout=float(options.startup_timeout or launch_cfg["startup_timeout"]),
        shutdown_budget=shutdown_budget(plan),
        max_concurrent_starts=options.max_concurrent_starts or launch_cfg.get("max_concurrent_starts"),
    )
    with open(os.path.join(run_dir, "launch.json"), "w") as f:
        json.dump({"plan": plan, "batches": options.batches, "shutdown_timeout": outcome.shutdown_budget}, f)
    progress = Progress(options.progress)
    with _caught_signals() as caught:
        runner = _start_runner(run_dir, outcome.max_concurrent_starts)
        outcome.state.runner_pid = runner.pid
        outcome.state.tracked.add(runner.pid, "collector")
        try:
            outcome.error = _supervise(outcome, runner, caught, progress)
        finally:
            _teardown(outcome, runner, caught, progress)
            progress.finish()
    outcome.finished = time.time()
    return outcome


def _start_runner(run_dir: str, slots: int | None) -> subprocess.Popen:
    env = dict(os.environ, **{RUN_DIR_VAR: run_dir})
    if slots:
        env[SLOTS_VAR] = str(slots)
    log = open(os.path.join(run_dir, "collector.log"), "wb")
    with log:
        return subprocess.Popen([sys.executable, "-m", "topo.launch.runner", run_dir], env=env,
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


@contextlib.contextmanager
def _caught_signals():
    """SIGINT/SIGTERM/SIGHUP recorded (in order) instead of raising; previous handlers restored after."""
    caught: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _supervise(outcome: Outcome, runner: subprocess.Popen, caught: list[int], progress: Progress) -> TopoError | None:
    state = outcome.state
    deadline = state.t0 + outcome.startup_timeout
    while True:
        state.update()
        progress.update(state)
        if caught:
            return Interrupted(caught[0])
        error = _failure(state)
        if error is not None:
            return error
        if runner.poll() is not None:
            outcome.runner_exit_code = runner.returncode
            if runner.returncode == 0 and "shutdown" in state.events:
                return None
            return LaunchError(f"the collector process exited with code {runner.returncode}"
                               f" (log: {os.path.join(state.run.path, 'collector.log')})")
        if state.phase is Phase.STARTING and time.time() > deadline:
            return _timeout_error(state, outcome.startup_timeout)
        collected = state.events.get("collected")
        if collected and time.time() > collected["time"] + outcome.shutdown_budget + STOP_GRACE_S:
            return LaunchError(f"the collector did not shut down within the {outcome.shutdown_budget:g}s budget")
        time.sleep(TICK_S)


def _failure(state: LaunchState) -> LaunchError | None:
    """The first failure the markers and events show, named as precisely as they allow."""
    failed = [w for w in state.workers.values() if w.failed]
    if failed:
        w = failed[0]
        last = w.failed.strip().splitlines()[-1]
        return LaunchError(f"env worker failed during construction: {last}", subcollector=w.subcollector,
                           worker=w.index, row=w.row, traceback=w.failed)
    error = state.events.get("error")
    if state.phase in (Phase.STARTING, Phase.COLLECTING):
        dead_subs = {i: t for i, pid in state.subcollector_pids.items() if (t := state.died_at(pid)) is not None}
        dead = [w for w in state.workers.values() if w.pid is not None and w.closed is None
                and (t := state.died_at(w.pid)) is not None and t < dead_subs.get(w.subcollector, float("inf"))]
        if dead:  # died before its subcollector: the worker is to blame
            w = dead[0]
            others = "".join(f"; also sub{o.subcollector}/w{o.index} (pid {o.pid})" for o in dead[1:])
            when = "while collecting" if w.constructed else "during construction"
            return LaunchError(f"env worker died {when} without a traceback (pid {w.pid}: killed by a signal,"
                               f" a crash or os._exit){others}", subcollector=w.subcollector, worker=w.index, row=w.row)
        if dead_subs:
            index = min(dead_subs, key=dead_subs.get)
            if error is not None or time.time() - dead_subs[index] > SUBCOLLECTOR_GRACE_S:
                message = f"subcollector process ended unexpectedly (pid {state.subcollector_pids[index]})"
                if error is None:
                    return LaunchError(message, subcollector=index)
                return _reported(error, f"{message}; the collector reported ", subcollector=index)
    return None if error is None else _reported(error, "the collector failed: ")


def _reported(error: dict, prefix: str, **where) -> LaunchError:
    """A LaunchError from the collector process's error event (its message's first line, then detail)."""
    head, _, rest = error["message"].partition("\n")
    return LaunchError(f"{prefix}{error['type']}: {head}", traceback=rest.strip() or error["traceback"], **where)


def _timeout_error(state: LaunchState, timeout: float) -> LaunchError:
    waiting = state.not_ready()
    now = time.time()
    names = [_describe(w, now) for w in waiting[:10]]
    if len(waiting) > 10:
        names.append(f"... and {len(waiting) - 10} more")
    message = (f"startup deadline of {timeout:g}s passed: {len(waiting)} of {len(state.workers)} env workers "
               f"not ready: " + "; ".join(names))
    if not waiting:
        message = f"startup deadline of {timeout:g}s passed: every env worker was built, the collector was not ready"
    if len(waiting) == 1:
        w = waiting[0]
        return LaunchError(message, subcollector=w.subcollector, worker=w.index, row=w.row)
    return LaunchError(message)


def _describe(w: Worker, now: float) -> str:
    where = f"sub{w.subcollector}/w{w.index}"
    if w.started is None:
        return f"{where} not started"
    return f"{where} constructing for {now - w.started:.1f}s (pid {w.pid})"


def _teardown(outcome: Outcome, runner: subprocess.Popen, caught: list[int], progress: Progress) -> None:
    """Let the collector process close its envs, then end whatever topo started that is still alive."""
    state = outcome.state
    outcome.teardown_started = time.time()
    has_collector = "ready" in state.events
    if runner.poll() is None and outcome.error is not None:
        if has_collector:
            runner.send_signal(signal.SIGTERM)  # the collector process shuts its collector down, closing envs
        else:
            _killpg(runner.pid)  # still starting: nothing to close, the whole session goes
    state.phase = Phase.SHUTTING_DOWN
    limit = time.time() + (outcome.shutdown_budget + STOP_GRACE_S if has_collector else STOP_GRACE_S)
    seen = len(caught)
    while runner.poll() is None and time.time() < limit and len(caught) == seen:  # a new signal escalates
        state.update()
        progress.update(state)
        time.sleep(TICK_S)
    state.update()
    state.tracked.add_group(runner.pid, "other")  # orphans keep the collector's process group
    left = processes.wait([state.tracked.procs[p] for p in state.tracked.alive()], LEFTOVER_GRACE_S)
    outcome.left_behind = sorted(p.pid for p in left if p.pid != runner.pid)
    outcome.killed = processes.terminate(left, TERM_GRACE_S)
    runner.wait()
    outcome.runner_exit_code = runner.returncode
    state.update()
    outcome.alive_after = state.tracked.alive()
    state.phase = Phase.DONE


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
