"""The trainer's side of a restart: :class:`Recovery`, the :class:`~topo.launch.supervision.port.RestartPort`
every engine asks while it starts a subcollector again.

The monitor's thread decides (:meth:`.monitor.Monitor.judge`): a restart (the subcollector is ``pending``) or
the run's failure. The engine, in the trainer's thread, asks :meth:`~Recovery.tick` and :meth:`~Recovery.lost`
whenever it checks its subcollectors, and restarts a lost one then: :meth:`~Recovery.begin` retires the old
start and hands over the new one's rows, policy factory and window (the engine builds the env from the rows),
and :meth:`~Recovery.poll_ready` follows a local one until it is instantiated. It imports no engine, and
neither torch nor torchrl.
"""
from __future__ import annotations

import time
from typing import Any, Callable, ContextManager

from topo.compiler import plan as _plan
from topo.runtime import heartbeat
from topo.launch import boundary
from topo.launch.supervision import failure as failures, processes
from topo.launch.supervision.delivery import Delivery
from topo.launch.supervision.failure import Failure
from topo.launch.supervision.monitor import Monitor
from topo.launch.supervision.port import Restarting
from topo.launch.supervision.recycle import Recycle, Recycler
from topo.launch.supervision.restarts import Restart
from topo.launch.supervision.state import RunState, Subcollector
from topo.launch.supervision.teardown import RETIRED_EXIT_S

VERDICT_S = 2.0  # a subcollector process ended: time for the monitor to see why (then the trainer says what it saw)
POLL_S = 0.1


class Recovery:
    """The run's side of restarts: ``window(k)`` is the launch window of a subcollector's ``k``-th restart;
    ``restart_policy(c)`` its policy factory (None: the first start's), ``weights()`` the last pushed."""

    def __init__(self, state: RunState, monitor: Monitor, delivery: Delivery, *,
                 window: Callable[[int], ContextManager], restart_policy: Callable[[int], Callable | None],
                 weights: Callable[[], Any]):
        self.state = state
        self.monitor = monitor
        self.delivery = delivery
        self.window = window
        self.restart_policy = restart_policy
        self.current_weights = weights
        self._graves: list[tuple[Any, float]] = []  # retired subcollector processes not yet gone
        self._askers: dict[int, tuple[int, Any]] = {}  # subcollector -> (restart, its heartbeat slot 0)
        self.recycler = Recycler(state, monitor.lock)

    @property
    def bell(self) -> int:
        """Readable when the monitor reached a verdict (a restart, the run's failure)."""
        return self.monitor.bell

    def tick(self) -> None:
        """Raise the run's failure once delivered; end what is left of retired subcollectors past their grace."""
        self.delivery.raise_if_failed()
        self._bury()

    def between_batches(self) -> None:
        """The trainer asked for the next batch: a subcollector with a worker past a health budget is to be
        rebuilt (:mod:`.recycle`; the collector starts it at its next check, as a restart)."""
        self.recycler.between_batches(time.time())

    def running_free(self, on: bool) -> None:
        """The subcollectors fill the replay buffer in the background, or stop (:meth:`.Delivery.background`)."""
        self.delivery.background(on)

    def waiting(self):
        """A wait of the trainer inside the engine: the run's failure interrupts it."""
        return self.delivery.interruptible()

    def failed(self, exc: BaseException) -> None:
        """The engine's own thread raised ``exc``, which no record explains: the run's failure, judged by the monitor."""
        if self.delivery.failure is None:
            self.monitor.submit(failures.collector_error(exc))

    def lost(self, index: int) -> bool:
        """Subcollector ``index`` must be started again (the monitor decided it)."""
        with self.monitor.lock:
            return self.state.subcollectors[index].pending

    def settle(self, index: int, pid: int | None, exitcode: int | None) -> None:
        """The process of subcollector ``index`` ended: the monitor's verdict on it (what it saw, or else
        what the trainer saw). Returns when a restart is decided; raises the run's failure otherwise."""
        how = processes.describe_exitcode(exitcode)
        with self.monitor.lock:
            restart = self.state.subcollectors[index].restart
        self.judge(index, Failure("subcollector-died", f"subcollector process ended unexpectedly ({how}, pid {pid})",
                                     time.time(), index, pid=pid, how=how, restart=restart))

    def begin(self, index: int, old: Any = None) -> Restarting:
        """The decided restart of ``index`` begins: its previous process ``old`` retired (None: its engine ended
        it), its number, plan rows, policy factory and launch window handed over."""
        if old is not None:
            self._retire(index, old)
        with self.monitor.lock:
            sub = self.state.subcollectors[index]
            sub.pending, sub.began = False, time.time()
            self._record(index, sub).began_at = sub.began
            rows = [self.state.workers[(index, row["index"])].row for row in _plan.subcollector(self.state.plan, index)["workers"]]
            restart = sub.restart
        return Restarting(restart, rows, self.restart_policy(index), self.window(restart))

    def blame(self, build: Callable[[RunState], Failure]) -> Failure:
        """``build(state)``, under the monitor's lock: a failure named from the run's records."""
        with self.monitor.lock:
            return build(self.state)

    def built(self, index: int) -> bool:
        """Every env worker of subcollector ``index``'s current start has built its env."""
        with self.monitor.lock:
            return all(w.constructed is not None for w in self.state.workers.values() if w.subcollector == index)

    def permits(self, has_permit) -> None:
        """The engine's answer to whether a worker may send a result (read by the monitor's hang rule)."""
        self.monitor.permitted = has_permit

    def instantiated(self, index: int) -> None:
        """The restart of ``index`` collects: its envs are built, its policy has the weights."""
        with self.monitor.lock:
            sub = self.state.subcollectors[index]
            sub.ready = time.time()
            self._record(index, sub).ready_at = sub.ready

    def poll_ready(self, index: int, restart: int, pipe, proc) -> str:
        """How the restart of subcollector ``index`` is doing: ``"ready"`` (instantiated: recorded),
        ``"waiting"``, or ``"lost"`` (it failed and a restart was decided again); raises when the run failed."""
        self.delivery.raise_if_failed()
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
        if message == boundary.INSTANTIATED:
            self.instantiated(index)
            return "ready"
        text, trace = boundary.startup_error(message)
        self.judge(index, failures.subcollector_failed(index, restart, proc.pid, text, trace))
        return "lost"

    def asked(self, index: int) -> None:
        """The trainer asked subcollector ``index`` for a batch: from now on it owes one (its heartbeat says so)."""
        restart = self.state.subcollectors[index].restart
        held, stamp = self._askers.get(index, (None, None))
        if held != restart:
            stamp = heartbeat.asker(self.state.run.path, index, restart)
            if stamp is None:
                return  # not started yet: asked again once it is
            old = self._askers.pop(index, (None, None))[1]
            if old is not None:
                old.close()  # the ended life's map: one file descriptor a restart, over a run of days
            self._askers[index] = (restart, stamp)
        stamp.start()

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
        groups (their forkservers), so that the run leaves none of them behind; unmap the beats files asked through."""
        self._bury(now=True)
        self._graves.clear()
        for _, stamp in self._askers.values():
            stamp.close()
        self._askers.clear()

    def judge(self, index: int, seen: Failure, *, first_records: bool = True) -> None:
        """Wait for the monitor's verdict on subcollector ``index``; past ``VERDICT_S`` without one (at once
        unless ``first_records``: what the trainer saw is all there is), submit what the trainer ``seen`` and
        wait for the verdict on that. Returns once a restart is decided; raises the run's failure otherwise.
        (A monitor that gives none, which only a stopped monitor would, leaves ``seen`` raised.)"""
        submitted = False
        deadline = time.monotonic() + (VERDICT_S if first_records else 0.0)
        while True:
            self.delivery.raise_if_failed()
            if self.lost(index):
                return
            if time.monotonic() >= deadline:
                if submitted:
                    raise seen.error()
                self.monitor.submit(seen)
                submitted, deadline = True, time.monotonic() + VERDICT_S
            time.sleep(POLL_S / 2)

    # -- inside -------------------------------------------------------------------------------
    def _retire(self, index: int, proc) -> None:
        """Set the last retired start of subcollector ``index`` going: SIGKILL its env workers now (a
        worker's death ends its subcollector's rollout anyway); the subcollector process, once it exited
        on its own (flushing its queue writes) or ``RETIRED_EXIT_S`` passed, goes with its process group."""
        with self.monitor.lock:
            old = self.state.retired_subcollectors_of(index)[-1]
            pids = {w.pid for w in self.state.retired_workers if (w.subcollector, w.restart) == (index, old.restart)
                    and w.pid and w.local}
        for p in processes.of_run(self.state.run.path, self.state.trainer_pid):
            if p.pid in pids:
                processes.kill(p)
        self._graves.append((proc, time.monotonic() + RETIRED_EXIT_S))

    def _bury(self, *, now: bool = False) -> None:
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

    def _record(self, index: int, sub: Subcollector) -> Restart | Recycle:
        return next(r for r in (*self.state.restarts, *self.state.recycles) if (r.subcollector, r.restart) == (index,
                                                                                                         sub.restart))
