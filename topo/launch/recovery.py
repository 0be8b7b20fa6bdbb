"""Restarts: which failures a restart cures, the budget, the seed a restarted worker gets, and the
run's side of a restart (what the collector asks while it starts a subcollector again, :mod:`.respawn`).

The unit of a restart is one subcollector: its process, its forkserver and its env workers. torchrl's
``ParallelEnv`` cannot replace one worker (a worker that dies ends its subcollector's rollout), so a
worker's death, a hang or a failed restart all restart its subcollector; the others keep their envs.
The restarted subcollector has the same plan rows (tasks, instructions, group ids, init states, render
device) and, for restart ``k``, seed ``planned seed + k x N`` (N: workers in the plan), so that no two
workers of a run ever draw the same stream, and a rerun draws the same ones. Imports neither torch nor
torchrl: the monitor decides here, the collector acts in :mod:`.respawn`.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from .. import heartbeat
from . import failure as failures, processes
from .failure import Failure
from .state import Subcollector

if TYPE_CHECKING:
    from .session import Run

SEED_SPAN = 2 ** 63  # seeds live in [0, 2**63): sequence seeds are 63-bit
SETTLE_S = 2.0  # a subcollector process ended: time for the monitor to see why
EXIT_GRACE_S = 5.0  # a retired subcollector whose workers were killed exits by itself (its last writes flushed);
#                     then SIGKILL for its whole process group
POLL_S = 0.1


def restart_seed(seed: int | None, restart: int, workers: int) -> int | None:
    """The seed of a worker planned with ``seed``, in restart ``restart`` of its subcollector."""
    if seed is None:
        return None
    out = seed + restart * workers
    return out - SEED_SPAN if out >= SEED_SPAN else out


def restart_rows(plan: dict, index: int, restart: int) -> list[dict]:
    """The plan rows of subcollector ``index`` as restart ``restart`` runs them: only the seed differs."""
    n = sum(sub["num_workers"] for sub in plan["subcollectors"])
    rows = []
    for row in plan["subcollectors"][index]["workers"]:
        seed = restart_seed(row["seed"], restart, n)
        rows.append({**row, "seed": seed, "kwargs": _reseeded(row["kwargs"], seed)})
    return rows


def _reseeded(kwargs: dict, seed: int | None) -> dict:
    """A row's ``create_env_kwargs`` with ``seed``: applied by ``set_seed``, and passed to a user factory
    as its ``seed`` argument too (:mod:`topo.backends.callable` puts it there)."""
    out = {**kwargs, "seed": seed}
    env = out.get("env")
    inner = env.get("kwargs") if isinstance(env, dict) else None
    if isinstance(inner, dict) and "seed" in inner:
        out["env"] = {**env, "kwargs": {**inner, "seed": seed}}
    return out


class Budget:
    """At most ``max`` restarts within any ``window`` seconds (None: the whole run)."""

    def __init__(self, section: dict | None):
        section = section or {}
        self.max = int(section.get("max", 0))
        self.window = section.get("window")
        self.spent: list[float] = []

    def allows(self, now: float) -> bool:
        recent = [t for t in self.spent if self.window is None or now - t < self.window]
        return len(recent) < self.max

    def spend(self, now: float) -> None:
        self.spent.append(now)

    def describe(self) -> str:
        if self.max == 0:
            return "restarts are off (launch.restarts)"
        within = f" within {self.window:g}s" if self.window is not None else ""
        return f"the restart budget is spent (launch.restarts: {self.max}{within})"


@dataclass
class Restart:
    """One restart of a subcollector: why, and how it went (times in epoch seconds)."""

    subcollector: int
    restart: int  # the start it made: 1 for the subcollector's first restart
    cause: Failure
    decided_at: float
    began_at: float | None = None  # the new subcollector process started
    ready_at: float | None = None  # it collects: envs built, policy connected
    superseded: bool = False  # it failed before it was ready, and another restart replaced it


def decide_restart(state, found: Failure, now: float) -> Restart:
    """Retire the subcollector ``found`` blames (:meth:`RunState.retire`); the record of its restart."""
    c = found.subcollector
    old = state.subcollectors[c]
    for r in state.restarts:
        if r.subcollector == c and r.restart == old.restart and r.ready_at is None:
            r.superseded = True
    state.retire(c, restart_rows(state.plan, c, old.restart + 1))
    record = Restart(c, old.restart + 1, found, now)
    state.restarts.append(record)
    return record


class Recovery:
    """The run's side of a restart, asked by the collector in the trainer's thread (:mod:`.respawn`).

    The monitor decides (:meth:`Monitor.judge`): a restart, or the run's failure. The collector asks
    :meth:`check` and :meth:`lost` whenever torchrl checks its processes, and restarts a lost
    subcollector then: :meth:`retire` the old one, :meth:`begin` the new one, :meth:`poll_ready` it
    until it is :meth:`ready`.
    """

    def __init__(self, run: Run):
        self.run = run
        self.state = run.state
        self.monitor = run.monitor
        self._graves: list[tuple[Any, float]] = []  # retired subcollector processes not yet gone
        self._askers: dict[tuple[int, int], Any] = {}  # (subcollector, restart) -> its heartbeat slot 0

    def check(self) -> None:
        """Raise the run's failure (:class:`~topo.errors.LaunchError`) once the monitor has found one."""
        found = self.monitor.failure
        if found is not None:
            raise found.error()

    def lost(self, index: int) -> bool:
        """Subcollector ``index`` must be started again (the monitor decided it)."""
        with self.monitor.lock:
            return self.state.subcollectors[index].pending

    def settle(self, index: int, pid: int | None, exitcode: int | None) -> None:
        """The process of subcollector ``index`` ended: wait for the monitor's verdict; if it saw nothing
        within ``SETTLE_S``, judge the death itself. Returns when a restart is decided; raises otherwise."""
        if self._verdict_within_settle(index):
            return
        how = processes.describe_exitcode(exitcode)
        with self.monitor.lock:
            restart = self.state.subcollectors[index].restart
        self.monitor.judge(Failure("subcollector-died", f"subcollector process ended unexpectedly ({how}, pid {pid})",
                                   time.time(), index, pid=pid, how=how, restart=restart))
        self.check()

    def retire(self, index: int, proc) -> None:
        """Set the last retired start of subcollector ``index`` going: SIGKILL its env workers now (a
        worker's death ends its subcollector's rollout anyway); the subcollector process, once it exited
        on its own (flushing its queue writes) or ``EXIT_GRACE_S`` passed, goes with its process group
        (:meth:`bury`). Returns at once: the restart starts meanwhile."""
        with self.monitor.lock:
            old = self.state.retired_subcollectors_of(index)[-1]
            pids = {w.pid for w in self.state.retired_workers if (w.subcollector, w.restart) == (index, old.restart)
                    and w.pid and w.local}
        for p in processes.of_run(self.state.run.path, self.state.trainer_pid):
            if p.pid in pids:
                processes.kill(p)
        self._graves.append((proc, time.monotonic() + EXIT_GRACE_S))

    def bury(self, *, now: bool = False) -> None:
        """End what is left of retired subcollectors: each one's process group once it exited or its grace
        passed (``now``: at once)."""
        for grave in list(self._graves):
            proc, deadline = grave
            if proc.is_alive() and time.monotonic() < deadline and not now:
                continue
            for p in processes.of_run(self.state.run.path, self.state.trainer_pid):
                if p.pid == proc.pid or processes.in_group(p, proc.pid):
                    processes.kill(p)
            proc.join(POLL_S)
            if not proc.is_alive():
                self._graves.remove(grave)

    def abandon(self, index: int, proc) -> None:
        """The run ends while a restart of subcollector ``index`` starts: end it now, its workers and its
        group (it never collected: nothing of it to close or flush)."""
        with self.monitor.lock:
            restart = self.state.subcollectors[index].restart
            pids = {w.pid for w in self.state.all_workers() if (w.subcollector, w.restart) == (index, restart) and w.pid}
        for p in processes.of_run(self.state.run.path, self.state.trainer_pid):
            if p.pid in pids or p.pid == proc.pid or processes.in_group(p, proc.pid):
                processes.kill(p)
        self._graves.append((proc, time.monotonic()))

    def close(self) -> None:
        """At teardown: end the retired subcollectors still there, in their grace or not, with their process
        groups (their forkservers), so that the run leaves none of them behind."""
        self.bury(now=True)
        self._graves.clear()

    def begin(self, index: int) -> tuple[int, Callable, Callable | None, Any]:
        """Start of a restart: (restart number, env factory, policy factory or None, the launch window)."""
        from .local import subcollector_env

        with self.monitor.lock:
            sub = self.state.subcollectors[index]
            sub.pending, sub.began = False, time.time()
            self._record(index, sub).began_at = sub.began
            rows = [self.state.workers[(index, row["index"])].row for row in self.run.plan["subcollectors"][index]["workers"]]
        plan = self.run.plan
        env_factory = functools.partial(subcollector_env, index, rows, plan["start_methods"]["workers"], dict(plan["launch"]))
        placement = self.run.placement
        policy_factory = placement.restart_factory(index) if placement is not None else None
        return sub.restart, env_factory, policy_factory, self.run.restart_environment(sub.restart)

    def poll_ready(self, index: int, restart: int, pipe, proc) -> str:
        """How the restart of subcollector ``index`` is doing: ``"ready"`` (it sent "instantiated"),
        ``"waiting"``, or ``"lost"`` (it failed and the monitor decided to restart it again); raises
        when the run failed instead."""
        self.check()
        if self.lost(index):
            return "lost"
        try:
            if not pipe.poll(0):
                if not proc.is_alive():
                    self.settle(index, proc.pid, proc.exitcode)
                    return "lost"
                return "waiting"
            message = pipe.recv()
        except (EOFError, OSError):
            proc.join(POLL_S)
            self.settle(index, proc.pid, proc.exitcode)
            return "lost"
        if message == "instantiated":
            return "ready"
        self._judge_startup_error(index, restart, proc.pid, message)
        self.check()
        return "lost"

    def _verdict_within_settle(self, index: int) -> bool:
        """Whether the monitor decided to restart subcollector ``index`` within ``SETTLE_S`` (raises its failure)."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            self.check()
            if self.lost(index):
                return True
            time.sleep(POLL_S / 2)
        return False

    def _judge_startup_error(self, index: int, restart: int, pid: int, message: Any) -> None:
        """The restarted subcollector sent an error: the monitor's verdict on its records, else this error."""
        if self._verdict_within_settle(index):
            return
        text = f"{message.get('exception_type')}: {message.get('exception_msg')}" if isinstance(message, dict) else str(message)
        trace = message.get("traceback") if isinstance(message, dict) else None
        self.monitor.judge(failures.subcollector_failed(index, restart, pid, text.splitlines()[0] if text else "", trace))

    def ready(self, index: int) -> None:
        with self.monitor.lock:
            sub = self.state.subcollectors[index]
            sub.ready = time.time()
            self._record(index, sub).ready_at = sub.ready

    def asked(self, index: int) -> None:
        """The trainer asked subcollector ``index`` for a batch: from now on it owes one (its heartbeat says so)."""
        restart = self.state.subcollectors[index].restart
        stamp = self._askers.get((index, restart))
        if stamp is None:
            stamp = heartbeat.asker(self.state.run.path, index, restart)
            if stamp is None:
                return  # not started yet: asked again once it is
            self._askers[(index, restart)] = stamp
        stamp.start()

    def current_weights(self):
        """The weights a restarted subcollector's policy starts from: the sender's, the last ones pushed."""
        placement = self.run.placement
        return placement.sender if placement is not None else None

    def _record(self, index: int, sub: Subcollector) -> Restart:
        return next(r for r in reversed(self.state.restarts) if (r.subcollector, r.restart) == (index, sub.restart))


def hang_kill(found: Failure) -> None:
    """A hang found: SIGKILL the process that hangs (a worker, or the subcollector), so that it is a death."""
    if found.kind in ("worker-hung", "subcollector-hung") and found.pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(found.pid, signal.SIGKILL)
