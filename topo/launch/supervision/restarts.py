"""Restarts as rules: which start a restart is, its cause, the budget.

The unit of a restart is one subcollector: its process, its forkserver and its env workers. torchrl's
``ParallelEnv`` cannot replace one worker (a worker that dies ends its subcollector's rollout), so a
worker's death, a hang or a failed restart all restart its subcollector; the others keep their envs.
The restarted subcollector has the same plan rows (tasks, instructions, group ids, init states, render
device) in a new worker life (:mod:`.lives`: only the seeds differ). Pure: the monitor decides
with these (:mod:`.monitor`), the collector acts (:mod:`.respawn`, :mod:`.recovery`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from topo.launch.supervision.lives import restart_rows
from topo.runtime import events

if TYPE_CHECKING:  # an annotation only: failure.py reads the run's state
    from topo.launch.supervision.failure import Failure


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
    for r in (*state.restarts, *state.recycles):
        if r.subcollector == c and r.restart == old.restart and r.ready_at is None:
            r.superseded = True
    state.retire(c, restart_rows(state.plan, c, old.restart + 1))
    record = Restart(c, old.restart + 1, found, now)
    state.restarts.append(record)
    events.record(state.run, "restart", subcollector=c, restart=record.restart, cause=found.kind, worker=found.worker,
                  message=found.message, decided_at=now)
    return record
