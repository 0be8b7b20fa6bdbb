"""A failure as a value: what went wrong first, where, with the plan row and the traceback.

:func:`decide` is the one place that reads a :class:`~topo.launch.supervision.state.RunState` and names the
culprit; :func:`hung` reads the step heartbeats. Both are pure: the monitor calls them while the run
goes on, and the unit tests on fabricated records. Blame never depends on the order in which things
were noticed: every candidate carries the time it happened (a failed marker's time, a death's pidfd
time, the moment a step passed its deadline), and the earliest wins; at one instant, a worker before
its subcollector before the server. Only the current start of each subcollector is read: what a
retired one did after it was replaced caused nothing.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping

from topo.compiler import plan as _plan
from topo.errors import LaunchError
from topo.runtime import heartbeat
from topo.launch.supervision.state import RunState, Worker
from topo.compiler.row import Row

#: at one instant, who is the more likely cause
_RANK = {"builder-raised": 0, "worker-raised": 0, "worker-died": 1, "worker-hung": 2, "policy-failed": 3, "subcollector-died": 4,
         "subcollector-hung": 5, "subcollector-failed": 6, "restart-timeout": 7, "server-died": 8}
#: what a restart of the subcollector can cure (a policy failure only in a subcollector, not in the server)
RESTARTABLE = frozenset(_RANK) - {"server-died"}


@dataclass(frozen=True)
class Failure:
    """What failed. ``kind`` is one of :data:`KINDS`; ``at`` is when it happened (epoch seconds)."""

    kind: str
    message: str
    at: float | None = None
    subcollector: int | None = None
    worker: int | None = None
    row: Row | None = None
    pid: int | None = None
    how: str | None = None  # "killed by SIGKILL", "exit code 3"
    traceback: str | None = None
    restart: int = 0  # the start of the subcollector it happened in (0: the first)
    host: str | None = None  # where ``pid`` runs, when not on this host (a Ray actor's node)

    @property
    def restartable(self) -> bool:
        """A restart of its subcollector can cure it."""
        return self.subcollector is not None and self.kind in RESTARTABLE

    def error(self) -> LaunchError:
        err = LaunchError(self.message, subcollector=self.subcollector, worker=self.worker, row=self.row,
                          traceback=self.traceback)
        err.failure = self
        return err

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("row")
        return out


KINDS = (*_RANK, "startup-timeout", "collector-error", "node-lost", "stalled")


def stalled(found: Any, at: float) -> Failure:
    """The stall watchdog's verdict (a :class:`topo.runtime.stall.Stall`), when ``launch.on_stall`` is fail: the run's."""
    return Failure("stalled", f"the run stalled: {found.describe()}", at)


def decide(state: RunState, until: float | None = None) -> Failure | None:
    """The first failure the records show (happening before ``until``, when given), or None."""
    found = [f for f in _candidates(state) if until is None or f.at is None or f.at < until]
    if not found:
        return None
    return min(found, key=lambda f: (f.at if f.at is not None else float("inf"), _RANK[f.kind], _ended(f)))


def _ended(f: Failure) -> bool:
    """A process SIGTERMed is one a shutdown ended (torchrl ends a dead worker's siblings so): at one instant,
    the other death is the cause."""
    return f.how == "killed by SIGTERM"


def _candidates(state: RunState):
    for w in state.workers.values():
        if w.failed:
            last = w.failed.strip().splitlines()[-1]
            if w.constructed is not None:  # its step loop raised (the async engine's workers record it)
                yield _at_worker(w, "worker-raised", f"env worker raised while collecting{_in(w.restart)}: {last}",
                                 w.failed_at, traceback=w.failed)
            else:
                yield _at_worker(w, "builder-raised", f"env worker failed during construction{_in(w.restart)}: {last}",
                                 w.failed_at, traceback=w.failed)
        elif w.died is not None and not w.closed and w.pid not in state.ended_by_peer:
            when = "while collecting" if w.constructed else f"during construction{_in(w.restart)}"
            how = w.died.how or "exit status unknown"
            yield _at_worker(w, "worker-died", f"env worker died {when} without a traceback ({how}, pid {w.pid})",
                             w.died.time, how=w.died.how)
    for p in state.current_policies():
        where = "the policy server" if p.role == "server" else f"subcollector {p.subcollector}{_in(p.restart)}"
        if p.failed:
            last = p.failed.strip().splitlines()[-1]
            yield Failure("policy-failed", f"policy factory failed in {where}: {last}", p.at, p.subcollector,
                          pid=p.pid, traceback=p.failed, restart=p.restart)
        elif p.died is not None and p.role == "server":
            how = p.died.how or "exit status unknown"
            yield Failure("server-died", f"policy server ended unexpectedly ({how}, pid {p.pid})", p.died.time,
                          pid=p.pid, how=p.died.how)
    for sub in state.subcollectors.values():
        if sub.died is not None and sub.pid not in state.ended_by_peer:
            how = sub.died.how or "exit status unknown"
            yield Failure("subcollector-died", f"subcollector process ended unexpectedly ({how}, pid {sub.pid})",
                          sub.died.time, sub.index, pid=sub.pid, how=sub.died.how, restart=sub.restart)


def hung(state: RunState, beats: Mapping[int, list[tuple[float, float]]], timeout: float, now: float,
         steps: Mapping[int, list[int]] | None = None, independent: bool = False,
         is_stopped: Callable[[int], bool] | None = None,
         free: Mapping[int, list[float | None]] | None = None) -> Failure | None:
    """The first hang the heartbeats show (:func:`topo.runtime.heartbeat.waiting_on`), among the subcollectors in
    ``beats`` (``steps``: each one's workers' step counts, when known).

    A worker hangs when one env step or reset has run for ``timeout`` seconds, or when its subcollector owes a
    batch, no worker stepped for ``timeout`` seconds and it took fewer steps than its siblings (stopped before
    its step began); a subcollector, when it owes a batch and waits on none of its workers. A hang happens
    ``timeout`` seconds after the step started (or the last one ended): that is its time for blame.
    ``independent``: async mode's workers, each stepping on its own (:func:`topo.runtime.heartbeat.waiting_on`). One
    idle (not in a step) hangs only while others step (within ``timeout``), or when it is stopped (``is_stopped(pid)``):
    a worker stopped where it shares a lock or an event with the server stalls every worker, and it is the one named.
    Idle counts while the trainer waits for a batch, and while the worker could send a result (``free``: per
    subcollector, since when each worker has had a result permit; :func:`topo.runtime.heartbeat.waiting_on`).
    """
    found = []
    latest = max((ended for slots in beats.values() for _, ended in slots[1:]), default=0.0)
    progressing = now - latest <= timeout
    for c, slots in beats.items():
        sub = state.subcollectors[c]
        counts = list((steps or {}).get(c) or [0] * (len(slots) - 1))
        waits = heartbeat.waiting_on(slots, counts, timeout, now, independent, (free or {}).get(c))
        if waits is None:
            continue
        if not waits:
            last = max([slots[0][0], *(ended for _, ended in slots[1:])])
            found.append(Failure("subcollector-hung", f"subcollector stopped answering while collecting: no env step "
                                 f"for {now - last:.1f}s while a batch was due (hang_timeout {timeout:g}s, pid {sub.pid})",
                                 last + timeout, c, pid=sub.pid, restart=sub.restart))
        for i, seconds in waits.items():
            w = state.workers.get((c, i))
            if w is None:
                continue
            started, ended = slots[i + 1]
            if started > ended:
                message = (f"env worker hung while collecting: its step has not returned for {now - started:.1f}s "
                           f"(hang_timeout {timeout:g}s, pid {w.pid}); it last finished a step {now - ended:.1f}s ago")
            elif independent:
                stopped = is_stopped is not None and w.pid is not None and is_stopped(w.pid)
                if not (progressing or stopped):
                    continue  # every worker waits: not this one's hang (a stalled server is the stall watch's)
                why = "the trainer waited for a batch" if slots[0][0] > slots[0][1] else "its siblings stepped"
                message = (f"env worker {'stopped' if stopped else 'hung'} while collecting: no step for {seconds:.1f}s "
                           f"while {why} (hang_timeout {timeout:g}s, pid {w.pid}); it took {counts[i]} steps")
            else:
                message = (f"env worker hung while collecting: its subcollector has waited {seconds:.1f}s for its step "
                           f"(hang_timeout {timeout:g}s, pid {w.pid}); it took {counts[i]} steps, its siblings "
                           f"{max(counts)}")
            found.append(_at_worker(w, "worker-hung", message, now - seconds + timeout, restart=w.restart))
    if independent and is_stopped is not None:  # a stopped worker stalls the others: it is the one to name
        found = [f for f in found if f.pid is not None and is_stopped(f.pid)] or found
    return min(found, key=lambda f: (f.at, _RANK[f.kind]), default=None)


def stopped_in(state: RunState, hung: Failure, is_stopped: Callable[[int], bool]) -> Failure | None:
    """A subcollector ``hung`` (waiting on none of its workers by their heartbeats) with one of its workers
    stopped (SIGSTOP, a debugger; ``is_stopped(pid)``): that worker is the hang, stopped after it stamped its
    step's end and before its subcollector heard of it."""
    for w in state.workers.values():
        if (w.subcollector, w.restart) == (hung.subcollector, hung.restart) and w.pid and w.local and is_stopped(w.pid):
            return _at_worker(w, "worker-hung", f"env worker stopped while collecting (pid {w.pid}): its subcollector "
                              f"waits for it ({hung.message.partition(': ')[2]})", hung.at, restart=w.restart)
    return None


def restart_timeout(state: RunState, index: int, timeout: float, now: float) -> Failure:
    """A restarted subcollector was not collecting ``timeout`` seconds after it started."""
    sub = state.subcollectors[index]
    waiting = [w for w in state.workers.values() if w.subcollector == index and w.constructed is None]
    names = "; ".join(_describe(w, now) for w in waiting[:10]) or "every env worker was built, the subcollector " \
        "was not ready"
    return Failure("restart-timeout", f"restart {sub.restart} of subcollector {index} not ready after {timeout:g}s "
                   f"(launch.startup_timeout): {names}", now, index, pid=sub.pid, restart=sub.restart)


def unpaused(state: RunState, index: int, waited: float) -> Failure:
    """Subcollector ``index`` was asked to pause (the background collector's ``pause()``) and never said it had."""
    sub = state.subcollectors[index]
    return Failure("subcollector-hung", f"subcollector did not pause within {waited:g}s (pid {sub.pid}): its rollout "
                   "never ended", time.time(), index, pid=sub.pid, restart=sub.restart)


def subcollector_failed(index: int, restart: int, pid: int | None, message: str, traceback: str | None) -> Failure:
    """A restarted subcollector reported an error that no record of its processes explains."""
    return Failure("subcollector-failed", f"subcollector failed to start{_in(restart)}: {message}", None, index,
                   pid=pid, traceback=traceback, restart=restart)


def remote_worker_died(state: RunState, index: int, worker: int, pid: int | None, how: str | None, where: str,
                       host: str, at: float, hung_s: float | None = None) -> Failure:
    """An env worker of a Ray actor died, as the actor saw it (its pid is on ``host``, the actor's node ``where``);
    ``hung_s``: the actor's watch SIGKILLed it, its step not returned for that long (``launch.hang_timeout``)."""
    w = state.workers[(index, worker)]
    if hung_s is not None:
        timeout = state.plan["launch"].get("hang_timeout")
        return Failure("worker-hung", f"env worker hung while collecting: the rollout had waited on its step for {hung_s:.1f}s "
                       f"(hang_timeout {timeout:g}s, pid {pid} on {where}); its actor killed it", at, index, worker,
                       w.row, pid, how=how, restart=w.restart, host=host)
    return Failure("worker-died", f"env worker died while collecting without a traceback ({how or 'exit status unknown'}, "
                   f"pid {pid} on {where})", at, index, worker, w.row, pid, how=how, restart=w.restart, host=host)


def worker_ended(state: RunState, index: int, worker: int, how: str | None, at: float) -> Failure:
    """An env worker of subcollector ``index`` that the engine saw end (``how``: its exit, or ``"raised: ERROR"``: its
    step loop sent an error) before any record of the run named why."""
    w = state.workers[(index, worker)]
    if how is not None and how.startswith("raised"):
        return _at_worker(w, "worker-raised", f"env worker {how} while collecting{_in(w.restart)} (pid {w.pid})", at)
    return _at_worker(w, "worker-died", f"env worker died while collecting without a traceback "
                      f"({how or 'exit status unknown'}, pid {w.pid})", at, how=how)


def actor_died(state: RunState, index: int, reason: str, where: str, at: float) -> Failure:
    """The Ray actor of subcollector ``index`` died on a node that is still there."""
    sub = state.subcollectors[index]
    return Failure("subcollector-died", f"subcollector {index}'s Ray actor died{_in(sub.restart)} on {where}, with "
                   f"env workers {_globals(state, index)} (global indices): {reason}", at, index, restart=sub.restart)


def actor_failed(state: RunState, index: int, message: str, traceback: str | None, where: str, at: float) -> Failure:
    """The Ray actor of subcollector ``index`` raised while collecting (it is alive; its rollout is lost)."""
    sub = state.subcollectors[index]
    return Failure("subcollector-failed", f"subcollector {index}'s Ray actor failed{_in(sub.restart)} on {where}: "
                   f"{message}", at, index, traceback=traceback, restart=sub.restart)


def node_lost(state: RunState, index: int, held: list[int], where: str, at: float) -> Failure:
    """The node of subcollector ``index``'s actor left the cluster, with the actors of subcollectors ``held``."""
    actors = "; ".join(f"subcollector {c}'s actor, env workers {_globals(state, c)}" for c in held)
    return Failure("node-lost", f"node {where} was lost: it held {actors} (global indices); a plan that pins them "
                   "there (placement resources) cannot restart them elsewhere", at, index,
                   restart=state.subcollectors[index].restart)


def server_actor_died(where: str, at: float) -> Failure:
    """The inference server's Ray actor no longer answers alive (it died, or its node left the cluster)."""
    return Failure("server-died", f"policy server ended unexpectedly: its Ray actor ({where}) no longer answers; "
                   "every subcollector's policy calls it", at)


def _globals(state: RunState, index: int) -> list[int]:
    return [row["global_index"] for row in _plan.subcollector(state.plan, index)["workers"]]


def _in(restart: int) -> str:
    return f" (restart {restart})" if restart else ""


def _at_worker(w: Worker, kind: str, message: str, at: float | None, **extra) -> Failure:
    extra.setdefault("restart", w.restart)
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
    elif not state.watch_workers and all(w.pid is None for w in waiting):  # Ray, no record of any worker yet
        message += ("; under Ray the actors' records reach the trainer once every actor is up, and an actor waits, "
                    "unstarted, for resources no node has free: `ray status` lists the pending demands")
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
