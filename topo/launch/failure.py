"""A failure as a value: what went wrong first, where, with the plan row and the traceback.

:func:`decide` is the one place that reads a :class:`~topo.launch.state.RunState` and names the
culprit. It is pure: the monitor calls it while the run goes on, the trainer once more when torchrl
raises, and the unit tests on fabricated records. Blame never depends on the order in which things
were noticed: every candidate carries the time it happened (a failed marker's time, a death's pidfd
time), and the earliest wins; at one instant, a worker before its subcollector before the server.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..errors import LaunchError
from .state import RunState, Worker

#: at one instant, who is the more likely cause
_RANK = {"builder-raised": 0, "worker-died": 1, "policy-failed": 2, "subcollector-died": 3, "server-died": 4}


@dataclass(frozen=True)
class Failure:
    """What failed. ``kind`` is one of :data:`KINDS`; ``at`` is when it happened (epoch seconds)."""

    kind: str
    message: str
    at: float | None = None
    subcollector: int | None = None
    worker: int | None = None
    row: dict | None = None
    pid: int | None = None
    how: str | None = None  # "killed by SIGKILL", "exit code 3"
    traceback: str | None = None

    def error(self) -> LaunchError:
        err = LaunchError(self.message, subcollector=self.subcollector, worker=self.worker, row=self.row,
                          traceback=self.traceback)
        err.failure = self
        return err

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("row")
        return out


KINDS = (*_RANK, "startup-timeout", "collector-error")


def decide(state: RunState, until: float | None = None) -> Failure | None:
    """The first failure the records show (happening before ``until``, when given), or None."""
    found = [f for f in _candidates(state) if until is None or f.at is None or f.at < until]
    if not found:
        return None
    return min(found, key=lambda f: (f.at if f.at is not None else float("inf"), _RANK[f.kind]))


def _candidates(state: RunState):
    subs = state.subcollectors
    for w in state.workers.values():
        if w.failed:
            last = w.failed.strip().splitlines()[-1]
            yield _at_worker(w, "builder-raised", f"env worker failed during construction: {last}", w.failed_at,
                             traceback=w.failed)
        elif w.died is not None and not w.closed:
            when = "while collecting" if w.constructed else "during construction"
            how = w.died.how or "exit status unknown"
            yield _at_worker(w, "worker-died", f"env worker died {when} without a traceback ({how}, pid {w.pid})",
                             w.died.time, how=w.died.how)
    for p in state.policies:
        where = "the policy server" if p.role == "server" else f"subcollector {p.subcollector}"
        if p.failed:
            last = p.failed.strip().splitlines()[-1]
            yield Failure("policy-failed", f"policy factory failed in {where}: {last}", p.at, p.subcollector,
                          pid=p.pid, traceback=p.failed)
        elif p.died is not None and p.role == "server":
            how = p.died.how or "exit status unknown"
            yield Failure("server-died", f"policy server ended unexpectedly ({how}, pid {p.pid})", p.died.time,
                          pid=p.pid, how=p.died.how)
    for sub in subs.values():
        if sub.died is not None:
            how = sub.died.how or "exit status unknown"
            yield Failure("subcollector-died", f"subcollector process ended unexpectedly ({how}, pid {sub.pid})",
                          sub.died.time, sub.index, pid=sub.pid, how=sub.died.how)


def _at_worker(w: Worker, kind: str, message: str, at: float | None, **extra) -> Failure:
    return Failure(kind, message, at, w.subcollector, w.index, w.row, w.pid, **extra)


def startup_timeout(state: RunState, timeout: float, now: float) -> Failure:
    """The startup deadline passed: the workers not ready, each with what it was doing."""
    waiting = state.not_ready()
    names = [_describe(w, now) for w in waiting[:10]]
    if len(waiting) > 10:
        names.append(f"... and {len(waiting) - 10} more")
    message = (f"startup deadline of {timeout:g}s passed: {len(waiting)} of {len(state.workers)} env workers "
               f"not ready: " + "; ".join(names))
    if not waiting:
        message = f"startup deadline of {timeout:g}s passed: every env worker was built, the collector was not ready"
    if len(waiting) == 1:
        return _at_worker(waiting[0], "startup-timeout", message, now)
    return Failure("startup-timeout", message, now)


def collector_error(exc: BaseException) -> Failure:
    """torchrl raised, and no process of the run is to blame."""
    head, _, rest = str(exc).partition("\n")
    return Failure("collector-error", f"the collector failed: {type(exc).__name__}: {head}", traceback=rest.strip() or None)


def _describe(w: Worker, now: float) -> str:
    if w.started is None:
        return f"{w.name} not started"
    return f"{w.name} constructing for {now - w.started:.1f}s (pid {w.pid})"
