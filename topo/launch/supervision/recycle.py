"""Health budgets (``launch.recycle``): rebuild a subcollector before its workers leak or slow it to death.

Between batches (:meth:`Recycler.between_batches`, from the collector's iterator), the trainer reads
each collecting subcollector's heartbeat file (:func:`topo.runtime.heartbeat.health`: a worker's resident
memory, its steps' mean duration over its own baseline, its resets) and, when a worker is past a budget
(:func:`breach`), decides a *recycle*: exactly a restart (:func:`.lives.restart_rows`: the same rows,
restart seeds; the collector rebuilds it as it rebuilds a failed one, :mod:`.respawn`), but caused by no
failure, so it spends no restart budget. Sync, a subcollector is idle between batches: no rollout is
lost. Async, the rollout it was collecting is. Imports neither torch nor torchrl.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topo.runtime import events
from topo.runtime import heartbeat
from topo.compiler.spec import Recycle as Budgets
from topo.launch.supervision.lives import restart_rows
from topo.compiler.row import Row

GB = 2**30


def budgets_of(plan: dict) -> Budgets | None:
    """The plan's ``launch.recycle`` as the spec declares it (a budget None is not checked); None: no recycling."""
    section = plan["launch"].get("recycle")
    return Budgets(**section) if section else None


@dataclass(frozen=True)
class Breach:
    """A worker past a budget: ``budget`` (its key), the worker's ``value`` and the ``limit``."""

    budget: str
    worker: int
    value: float
    limit: float
    pid: int | None = None

    def describe(self) -> str:
        """``rss 1.9 GB > max_rss_gb 1.5``, ``latency drift 2.3 > max_latency_drift 1.5``, ``episodes begun 21 > max_episodes 20``."""
        what = {"max_rss_gb": f"rss {self.value:.2f} GB", "max_latency_drift": f"latency drift {self.value:.2f}",
                "max_episodes": f"episodes begun {self.value:g}"}[self.budget]
        return f"{what} > {self.budget} {self.limit:g}"

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "worker": self.worker, "value": round(self.value, 3), "limit": self.limit,
                "pid": self.pid}


def breach(workers: list[heartbeat.Health | None], budgets: Budgets) -> Breach | None:
    """The first worker past a budget (workers in order; for each, memory, then drift, then episodes), or None.
    Episodes are counted as begun (resets): one that began ``max_episodes + 1`` finished ``max_episodes``."""
    for w, h in enumerate(workers):
        if h is None:
            continue
        found = [("max_rss_gb", h.rss / GB if h.rss else None), ("max_latency_drift", h.drift),
                 ("max_episodes", h.resets)]
        for budget, value in found:
            limit = getattr(budgets, budget)
            if limit is not None and value is not None and value > limit:
                return Breach(budget, w, value, limit, h.pid or None)
    return None


@dataclass
class Recycle:
    """One recycle of a subcollector: the breach, and how its rebuild went (times in epoch seconds)."""

    subcollector: int
    restart: int  # the start it made (restarts and recycles count alike: its seeds are restart seeds)
    breach: Breach
    row: Row  # the plan row of the worker past its budget
    decided_at: float
    began_at: float | None = None
    ready_at: float | None = None
    superseded: bool = False  # it failed before it was ready, and a restart replaced it


def decide_recycle(state, index: int, found: Breach, now: float) -> Recycle:
    """Retire subcollector ``index`` (:meth:`RunState.retire`) for ``found``; the record of its recycle."""
    old = state.subcollectors[index]
    row = state.workers[(index, found.worker)].row
    state.retire(index, restart_rows(state.plan, index, old.restart + 1))
    record = Recycle(index, old.restart + 1, found, row, now)
    state.recycles.append(record)
    events.record(state.run, "recycle", subcollector=index, restart=record.restart, worker=found.worker,
                  breach=found.describe(), decided_at=now)
    return record


class Recycler:
    """The trainer's budget check: every ``check_every`` batches, each subcollector that collects (its current
    start instantiated, no restart pending) is read, and the first past a budget is recycled."""

    def __init__(self, state, lock):
        self.state = state
        self.lock = lock
        self.budgets = budgets_of(state.plan)
        self.batches = 0

    def between_batches(self, now: float) -> list[Recycle]:
        """A batch was handed to the trainer: check when due; the recycles decided."""
        self.batches += 1
        if self.budgets is None or self.batches % self.budgets.check_every:
            return []
        out = []
        with self.lock:
            for c, sub in sorted(self.state.subcollectors.items()):
                if sub.pending or not sub.local or (not sub.first and not sub.ready):
                    continue
                found = breach(heartbeat.health(self.state.run.path, c, sub.restart) or [], self.budgets)
                if found is not None:
                    out.append(decide_recycle(self.state, c, found, now))
        return out
