"""torchrl's multi-process collectors, able to start one subcollector again while the others collect.

:class:`Respawning` is mixed into ``MultiSyncCollector`` and ``MultiAsyncCollector`` (the real ones:
their iterators, shutdown and weight sync are torchrl's). It changes what torchrl sees of its
subcollectors, not what torchrl does with them:

- ``procs[c]`` answers ``is_alive()`` by asking the run's restart port
  (:class:`~topo.launch.supervision.port.RestartPort`):
  torchrl asks before each batch and every second it waits. The run's failure is raised there; a
  subcollector the monitor decided to restart is started again there, with the arguments torchrl gave
  its first process (captured when torchrl made it) but a new pipe, its restart's env factory (same
  plan rows, the restart's seeds), its policy factory, and new weight-sync queues. torchrl's own
  "At least one process failed" (which terminates every subcollector) is never reached.
- ``pipes[c]`` remembers whether subcollector ``c`` owes a batch (torchrl sent "continue" and got
  nothing back yet): a restarted subcollector that owes one is asked for it again.
- ``queue_out`` also reads the private queue each restarted subcollector writes to, and drops what the
  shared queue still holds from a subcollector since restarted.
- its ``iterator`` asks the supervisor to check the run's health budgets between batches
  (``launch.recycle``, :mod:`~topo.launch.supervision.recycle`): a subcollector past one is restarted as above.
- in the background (``start()``: the subcollectors run free, filling the shared replay buffer, and the trainer
  never asks for a batch), a thread of topo's checks them as the iterator would, and sets a restarted one
  running free; :meth:`pause` is torchrl's pause for subcollectors that may die or restart meanwhile (a restart
  begun during a pause starts paused and runs free again when the pause ends), and one that keeps the rollout each
  subcollector has in flight, which torchrl's drops (:class:`~topo.launch.boundary.KeepingPipe`).

The contract (the batch in flight): sync, the batch being gathered waits for the restarted
subcollector's first rollout and has every subcollector, as always; what a subcollector delivered
before it failed is used, what it was collecting is lost. Async, the failed subcollector's rollout in
flight is lost; the others' batches are not touched. Weight updates: :meth:`update_policy_weights_`
waits for every subcollector's acknowledgement itself, and a subcollector restarted meanwhile starts
from the weights just pushed.

Every private torchrl name used here goes through :mod:`.boundary`.
"""
from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import queue as queues
import select
import threading
import time
import warnings
from multiprocessing import connection
from typing import Any, Callable

from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

from topo.runtime import quiet
from topo.runtime.time_breakdown import Pace

from topo.launch import boundary, forkserver
from topo.launch.supervision import failure as failures
from topo.launch.supervision.port import RestartPort

ACK_POLL_S = 0.05
KEEP_S = 0.2  # in the background: how often the subcollectors are checked (at once when the monitor decides)
BUDGETS_S = 1.0  # in the background: how often the health budgets are (an iterating trainer: between batches)
PAUSE_S = 30.0  # torchrl's own wait for a subcollector to pause; past it (no restart meanwhile), it is hung


class Respawning:
    """Mixin: ``class X(Respawning, MultiSyncCollector)``; restarts work once :meth:`supervise` was called."""

    recovery: RestartPort | None = None
    env_factory: Callable[[int, list[dict]], Callable] | None = None  # (c, rows) -> a restart's env factory

    def supervise(self, port: RestartPort, env_factory: Callable[[int, list[dict]], Callable]) -> None:
        """From now on the run's ``port`` decides restarts; ``env_factory(c, rows)`` builds a restart's env factory."""
        self.recovery, self.env_factory = port, env_factory

    def _run_processes(self) -> None:
        """torchrl's, recording how it made each subcollector process (Python forgets a started process's arguments)."""
        made: list[tuple[Any, dict]] = []
        with boundary.recording_processes(made):
            super()._run_processes()
        self._made = made
        self._real = list(self.procs)
        self._restarts = [0] * len(self._real)  # restarts begun, per subcollector
        self._starting: dict[int, tuple[int, Any]] = {}  # c -> (its restart number, its pipe) until instantiated
        self._replaced: list = []  # weight-sync queues a restart replaced, kept while any restart is starting
        self._live = True
        self._guard = threading.RLock()  # the trainer's thread and the background keeper check the subcollectors
        self._background = False  # start() was called: the subcollectors fill the replay buffer themselves
        self._free = False  # running free in the background (outside a pause)
        self._keeper: threading.Thread | None = None
        self.procs = [_Process(self, c) for c in range(len(self._real))]
        self.pipes = [_Pipe(p, functools.partial(self._asked, c)) for c, p in enumerate(self.pipes)]
        self.queue_out = _Inbox(self.queue_out, self.pipes, self)

    def iterator(self):
        """torchrl's; once the trainer asks for the next batch, and before torchrl checks its processes and asks
        each subcollector, the run checks its health budgets (a subcollector past one starts again then)."""
        self.pace = pace = Pace()  # the trainer's time between batches (topo.runtime.time_breakdown)
        pace.asked(time.monotonic())
        for batch in super().iterator():
            pace.got(time.monotonic())
            yield batch
            pace.asked(time.monotonic())
            if self.recovery is not None:
                self.recovery.between_batches()

    # -- what torchrl asks ----------------------------------------------------------------------
    def _alive(self, c: int) -> bool:
        proc = self._real[c]
        recovery = self.recovery
        if recovery is None or not self._live:
            return not proc._closed and proc.is_alive()  # torchrl's own answer
        with self._guard:
            recovery.tick()
            if c in self._starting:
                self._poll(c)
            elif recovery.lost(c):
                self._begin(c, proc)
            elif not proc.is_alive():
                recovery.settle(c, proc.pid, proc.exitcode)
                self._begin(c, proc)
        return True

    def _asked(self, c: int) -> None:
        if self.recovery is not None:
            self.recovery.asked(c)

    def _begin(self, c: int, old) -> None:
        """Set the process of subcollector ``c`` aside and start its restart (ready later: :meth:`_poll`)."""
        recovery = self.recovery
        start = recovery.begin(c, old)
        cls, made = self._made[c]
        method = made["_start_method"]
        ctx = multiprocessing.get_context(method)
        parent, child = ctx.Pipe()
        out = ctx.Queue(self._queue_len)
        kwargs = {**made["kwargs"], "pipe_child": child, "queue_out": out,
                  "create_env_fn": boundary.pickled(self.env_factory(c, start.rows))}
        if start.policy_factory is not None:
            kwargs["policy_factory"] = boundary.pickled(start.policy_factory)
        scheme = (kwargs.get("weight_sync_schemes") or {}).get("policy")
        if scheme is not None:
            self._replaced += boundary.rewire(scheme, c, ctx)  # new queues: the old process may have died holding one
        with start.window:
            target = made["target"]
            if method == "forkserver":  # a forkserver's child has the server's environment, not this window's
                target = functools.partial(forkserver.in_environ, dict(os.environ), target)
            proc = cls(target=target, num_threads=made["num_threads"], _start_method=method, kwargs=kwargs)
            proc.start()
        child.close()
        if scheme is not None:
            boundary.send_first_weights(scheme, c, self, recovery.current_weights())
        self._real[c] = proc
        self._restarts[c] += 1
        self._starting[c] = (start.restart, parent)
        self.queue_out.serve(c, out, parent)  # from now on, what the old process still sends is dropped

    def _poll(self, c: int) -> None:
        """A restart of ``c`` is starting: once it is instantiated, torchrl talks to it (and asks for the
        batch it owes); if it failed and another restart was decided, that one begins."""
        restart, parent = self._starting[c]
        state = self.recovery.poll_ready(c, restart, parent, self._real[c])
        if state == "lost":
            del self._starting[c]
            parent.close()
            self._begin(c, self._real[c])
        elif state == "ready":
            del self._starting[c]
            if not self._starting:  # every restart's process has unpickled what it was given
                self._replaced.clear()
            self.queue_out.started(c)
            self.pipes[c].replace(parent)
            if self._free:
                self.pipes[c].send((None, "run_free"))
            elif not self._background:  # paused, it runs free when the pause ends
                self.pipes[c].ask_again()

    # -- in the background ----------------------------------------------------------------------
    def start(self):
        """torchrl's (the subcollectors run free, filling the replay buffer); then topo's keeper checks them."""
        super().start()
        if self.recovery is None:
            return
        self._background = self._free = True
        self.recovery.running_free(True)
        self._keeper = threading.Thread(target=self._keep, name="topo-background-keeper", daemon=True)
        self._keeper.start()

    def _keep(self) -> None:
        """While the collector runs free: each subcollector checked as torchrl's iterator would (a lost one
        restarted and set running free), the health budgets every :data:`BUDGETS_S`. What it raises is the run's."""
        budgets = time.monotonic()
        try:
            while self._live:
                if self._free:
                    with self._guard:
                        for c in range(len(self._real)):
                            self._alive(c)
                    if time.monotonic() - budgets >= BUDGETS_S:
                        budgets = time.monotonic()
                        self.recovery.between_batches()
                if select.select([self.recovery.bell], [], [], KEEP_S)[0]:
                    _hush(self.recovery.bell)
        except BaseException as exc:  # noqa: BLE001 - the run's failure reaches the trainer through the monitor
            if self._live:
                self.recovery.failed(exc)

    @contextlib.contextmanager
    def pause(self):
        """torchrl's pause (every subcollector stops collecting; the body runs; they run free again), for
        subcollectors that die, hang or restart meanwhile: a restarted one is not waited for (it starts paused)."""
        if self.recovery is None or not self._background:
            with super().pause():
                yield
            return
        with self.recovery.waiting():
            with self._guard:
                self._free = False
                asked = {c: self._restarts[c] for c in range(len(self._real))
                         if c not in self._starting and self._send(c, "pause")}
            self._await_paused(asked)
        self.recovery.running_free(False)
        try:
            yield
        finally:
            with self._guard:
                for c in range(len(self._real)):
                    if c not in self._starting:
                        paused = c in asked and self._restarts[c] == asked[c]  # else restarted since: not paused
                        self._send(c, "restart" if paused else "run_free")
                self._free = True
            self.recovery.running_free(True)

    def _send(self, c: int, message: str) -> bool:
        """Send ``message`` to subcollector ``c``; False if it is gone (the next check restarts it)."""
        try:
            self.pipes[c].send((None, message))
        except (BrokenPipeError, ConnectionResetError, OSError):
            return False
        return True

    def _await_paused(self, asked: dict[int, int]) -> None:
        """Until each subcollector asked to pause said "paused", or was restarted since (its restart is paused);
        one silent for :data:`PAUSE_S` is judged hung (restarted, or the run fails naming it)."""
        waiting, since = dict(asked), time.monotonic()
        while waiting:
            try:
                item = self.queue_out.get(timeout=KEEP_S)
            except queues.Empty:
                item = None
            c = boundary.sender_of(item) if item is not None else None
            if c in waiting and item[1] == "paused":
                del waiting[c]
                since = time.monotonic()
            for c, restarts in list(waiting.items()):
                self._alive(c)
                if self._restarts[c] != restarts:
                    del waiting[c]
                    since = time.monotonic()
                elif time.monotonic() - since > PAUSE_S:
                    self.recovery.judge(c, self.recovery.blame(functools.partial(failures.unpaused, index=c, waited=PAUSE_S)),
                                        first_records=False)

    # -- weights --------------------------------------------------------------------------------
    def update_policy_weights_(self, policy_or_weights=None, *, worker_ids=None, **kwargs) -> None:
        """torchrl's push; then wait for each subcollector's acknowledgement, restarting a lost one
        (which starts from the weights just pushed) instead of waiting for it forever."""
        scheme = boundary.weight_scheme(self)
        if self.recovery is None or scheme is None or scheme.sync or worker_ids is not None:
            return super().update_policy_weights_(policy_or_weights, worker_ids=worker_ids, **kwargs)
        for c in range(len(self._real)):
            self._alive(c)  # a lost subcollector would never acknowledge: start it first
        waiting = {c: (self._restarts[c], boundary.ack_queue(scheme, c)) for c in range(len(self._real))}
        super().update_policy_weights_(policy_or_weights, worker_ids=worker_ids, **kwargs)
        while waiting:  # a restarting subcollector acknowledges once it is up (its receiver reads the push then)
            for c, (restarts, acks) in list(waiting.items()):
                try:
                    acks.get(timeout=ACK_POLL_S)
                except queues.Empty:
                    self._alive(c)
                    if self._restarts[c] == restarts:
                        continue
                del waiting[c]  # acknowledged, or restarted since: the restart starts from the weights pushed

    # -- the end --------------------------------------------------------------------------------
    def shutdown(self, *args, **kwargs):
        self._live = False  # torchrl's shutdown asks is_alive() too: no restart from there
        keeper, self._keeper = getattr(self, "_keeper", None), None
        if keeper is not None:
            keeper.join(KEEP_S * 5)
            self.recovery.running_free(False)
        for c in list(getattr(self, "_starting", ())):  # not connected: it would never hear "close"
            self.recovery.abandon(c, self._real[c])
            del self._starting[c]
        return super().shutdown(*args, **kwargs)


class _Process:
    """``procs[c]`` as torchrl sees it: the current process of subcollector ``c``, alive as the run says."""

    def __init__(self, owner: Respawning, c: int):
        self._owner = owner
        self._c = c

    def is_alive(self) -> bool:
        return self._owner._alive(self._c)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner._real[self._c], name)


class _Pipe:
    """``pipes[c]``: the connection to subcollector ``c``, remembering whether it owes a batch (and
    stamping its heartbeat when one is asked: :mod:`topo.runtime.heartbeat`)."""

    def __init__(self, conn, on_ask):
        self.conn = conn
        self.on_ask = on_ask
        self.owes = False
        self.asked = "continue"

    def send(self, obj: Any) -> None:
        message = obj[1] if isinstance(obj, tuple) and len(obj) == 2 else None
        if message in boundary.CONTINUE:
            self.owes, self.asked = True, message
            self.on_ask()
        try:
            self.conn.send(obj)
        except (BrokenPipeError, ConnectionResetError):
            if message not in boundary.CONTINUE:
                raise
            # it died: the next check starts it again and asks again

    def replace(self, conn) -> None:
        self.conn.close()
        self.conn = conn

    def ask_again(self) -> None:
        if self.owes:
            self.send((None, self.asked))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class _Inbox:
    """``queue_out``: torchrl's shared output queue, and the private queue of each restarted subcollector.

    It also waits on the pipe of each restart that is starting, and on the monitor's bell: the moment a
    restart says "instantiated", or the monitor decides a restart or the run's failure, ``get`` returns
    empty-handed, so that torchrl checks its processes at once (:meth:`Respawning._alive` acts then).
    """

    def __init__(self, shared, pipes: list[_Pipe], owner: Respawning):
        self.shared = shared
        self.private: dict[int, Any] = {}
        self.starting: dict[int, Any] = {}
        self.pipes = pipes
        self.owner = owner
        self.unreadable = False  # an item whose sender could not be read was seen (warned once)
        self.lost_items = 0  # items whose sender died before they were read

    def serve(self, c: int, queue, pipe) -> None:
        self.private[c] = queue  # a previous private queue of c is dropped with what it holds
        self.starting[c] = pipe

    def started(self, c: int) -> None:
        self.starting.pop(c, None)

    def get(self, block: bool = True, timeout: float | None = None):
        while True:
            item, source = self._get_any(timeout if block else 0)
            c = boundary.sender_of(item)
            if c is None and not self.unreadable:  # torchrl changed its queue items: say what stops working
                self.unreadable = True
                warnings.warn(f"topo: torchrl's output queue item {type(item).__name__} names no subcollector "
                              "(expected ((data, idx), j) or (idx, j)): batches a restarted subcollector's "
                              "predecessor left in the queue are no longer dropped", RuntimeWarning, stacklevel=2)
            if source is self.shared and c in self.private:
                continue  # written by a subcollector since restarted: its successor collects instead
            if c is not None and 0 <= c < len(self.pipes):
                self.pipes[c].owes = False
            return item

    def _get_any(self, timeout: float | None):
        queues_ = [self.shared, *self.private.values()]
        recovery = self.owner.recovery
        bell = [recovery.bell] if recovery is not None else []
        ready = connection.wait([q._reader for q in queues_] + list(self.starting.values()) + bell, timeout)
        for q in queues_:
            if q._reader in ready:
                try:
                    return q.get(block=False), q
                except queues.Empty:
                    continue
                except Exception as exc:  # noqa: BLE001 - raised again unless its sender died
                    if not quiet.ended_by_a_peer(exc):
                        raise
                    # its sender died before its tensors were fetched (they come from the sender's resource
                    # sharer): its rollout is lost, as a dead subcollector's is; the monitor names the death
                    self.lost_items += 1
        if bell and bell[0] in ready:
            _hush(bell[0])
        raise queues.Empty

    def close(self) -> None:
        for q in (self.shared, *self.private.values()):
            q.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.shared, name)


def _hush(bell: int) -> None:
    """Read what rang the monitor's bell (non-blocking: another thread may have read it first)."""
    with contextlib.suppress(BlockingIOError):
        os.read(bell, 64)


class RespawningSyncCollector(Respawning, MultiSyncCollector):
    """torchrl's ``MultiSyncCollector``, restarting a subcollector in place (:class:`Respawning`)."""


class RespawningAsyncCollector(Respawning, MultiAsyncCollector):
    """torchrl's ``MultiAsyncCollector``, restarting a subcollector in place (:class:`Respawning`)."""
