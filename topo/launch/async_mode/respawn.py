"""Restarts in async mode: torchrl's ``AsyncBatchedCollector``, whose env worker processes topo starts again.

torchrl runs each env worker as a process of its own (its env, its step loop, a fixed request slot of the server)
and restarts none: a dead one ends the collector. The unit of a restart is the plan's subcollector, as in every
engine (:mod:`topo.launch.supervision.restarts`): in async mode a subcollector is only a group of rows (no process
of its own), so a plan of one-worker subcollectors restarts one env worker at a time, at no cost.

torchrl makes its worker processes and what they share with the context its transport holds; here that context
is :class:`Context`, which makes what they share of nothing a worker can hold (:mod:`.channels`,
:mod:`.transport`: a worker stopped or killed anywhere blocks only itself) and keeps what a restart needs:

- each worker process's arguments (Python forgets them once it starts): a restart is the same loop, slot and
  channel, over the row's kwargs in the restart's worker life;
- the result permits (torchrl bounds what its workers hold and send to 2 x N transition chunks, from one pool) are
  each worker life's own (:class:`Permits`: 2 chunks each, a semaphore per life): a restart starts with its own
  budget, and what a dead worker held needs no counting (a count the worker keeps itself is wrong by one whenever
  it dies between the count and the semaphore, and such errors add up over restarts);
- the result and error queues are each worker's own channel to the trainer (:class:`Inbox`, :class:`Outbox`),
  each message tagged with its worker's life: what a retired life sent is dropped, its permit given back; a
  current worker's error is its restart's cause, judged by the run, never torchrl's raise. With restarts, a
  worker whose loop raised exits once its error is sent (its ``failed`` marker written).

Its iterator (:class:`Supervised`) times the trainer between batches (the time breakdown's pace), stamps each
subcollector's beats file while a batch is owed (a worker that has not stepped for ``launch.hang_timeout`` while
one is owed hangs: :func:`topo.runtime.heartbeat.waiting_on`) and asks the run's health budgets between batches
(``launch.recycle``: a worker past one is rebuilt as a restart is).

torchrl's ``_workers`` become :class:`_Worker` proxies: ``is_alive()`` asks the run's restart port (as
:mod:`topo.launch.local.respawn` does for subcollectors), and a restart decided begins there, in the trainer's
thread (torchrl asks every second while it waits for results, and nothing it waits on can be a worker's to hold):
the group's workers SIGKILLed, what they held given back (the part of a message their channel holds, their
slot's unclaimed post), their lives bumped (what they sent and the trainer had not taken is dropped), their restarts started in the restart's launch window; a
thread of the respawner's own (its keeper) sees them built. The contract: what the group's old workers had not
handed to the trainer is lost; the other workers step on.
"""
from __future__ import annotations

import collections
import functools
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
from typing import Any, Callable

from torchrl.collectors import AsyncBatchedCollector

from topo.runtime import heartbeat
from topo.runtime.rundir import RunDir
from topo.runtime.time_breakdown import Pace
from topo.launch import boundary, forkserver
from topo.launch.async_mode import slots
from topo.launch.async_mode.channels import ERROR, RESULT, Channels, Flag, Sender
from topo.launch.supervision import failure as failures, processes
from topo.launch.supervision.port import RestartPort

KEEP_S = 0.5  # the keeper's look at which workers it watches


class Supervised(AsyncBatchedCollector):
    """torchrl's collector; its iterator keeps the trainer's pace, the batch owed and the health budgets."""

    respawner: Respawner | None = None  # set once its workers started

    def iterator(self):
        self.pace = pace = Pace()  # the trainer's time between batches (topo.runtime.time_breakdown)
        pace.asked(time.monotonic())
        self._owed(True)
        for batch in super().iterator():
            pace.got(time.monotonic())
            self._owed(False)
            yield batch
            pace.asked(time.monotonic())
            self._owed(True)
            if self.respawner is not None:
                self.respawner.between_batches()

    def _owed(self, on: bool) -> None:
        if self.respawner is not None:
            self.respawner.owed(on)


class Context:
    """The multiprocessing context torchrl starts the async env workers with, keeping what restarts need; what the
    workers share with the trainer it makes of nothing a worker can hold (:mod:`.channels`)."""

    def __init__(self, ctx, workers: int, restarts: bool = False):
        """``restarts``: a worker whose loop raised exits once its error is sent (its restart follows)."""
        self.ctx, self.restarts = ctx, restarts
        self.made: dict[int, dict[str, Any]] = {}  # env id -> its process's arguments
        self.life = ctx.Array("i", workers, lock=False)  # each worker's life: bumped when it restarts
        self.channels = Channels(ctx, workers)
        self.budget = [None] * workers  # each worker life's result permits (a semaphore), made at its start
        self.permits: Permits | None = None
        self.respawner: Respawner | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "ctx":
            raise AttributeError(name)
        return getattr(self.ctx, name)

    def __reduce__(self):
        """Where the transport travels (the server's process), the plain context."""
        return multiprocessing.get_context, (self.ctx.get_start_method(),)

    def Process(self, *, target, kwargs: dict, name: str, daemon: bool = True):
        """Env worker ``kwargs["env_id"]``, given its own ends of the result and error queues."""
        i = kwargs["env_id"]
        kwargs = {**kwargs, "result_queue": kwargs["result_queue"].outbox(i), "error_queue": kwargs["error_queue"].outbox(i)}
        self.made[i] = {"target": target, "kwargs": kwargs, "name": name}
        return self.start(i, kwargs)

    def start(self, i: int, kwargs: dict):
        """A process (not started) for env worker ``i`` over ``kwargs``, in this process's environment as it is now
        (a forkserver's children would inherit the forkserver's, as it was when it started: a restart's launch
        window sets its worker life there)."""
        made = self.made[i]
        self.budget[i] = self.ctx.Semaphore(self.permits.each)
        return self.ctx.Process(target=functools.partial(forkserver.in_environ, dict(os.environ), made["target"]),
                                kwargs={**kwargs, "result_capacity": self.budget[i]}, name=made["name"], daemon=True)

    def Event(self) -> Flag:
        return Flag(self.ctx)

    def BoundedSemaphore(self, value: int) -> Permits:
        """torchrl's pool of ``value`` result permits, made a budget of ``value / N`` per worker life."""
        self.permits = Permits(self, max(1, value // len(self.life)))
        return self.permits

    def Queue(self, maxsize: int = 0) -> Inbox:
        """torchrl's result queue (``maxsize``: it counts permits) or its error queue; unbounded, the permits bound it."""
        return Inbox(self, RESULT if maxsize > 0 else ERROR)


class Permits:
    """torchrl's result permits, in the trainer: it gives one back for each result it took (``release``, right
    after): to the budget of the worker life that sent it, unless that life is retired (its budget went with it)."""

    def __init__(self, context: Context, each: int):
        self.each = each  # a worker life's budget
        self._context = context
        self.taken: collections.deque = collections.deque()  # (worker, life) of each result handed to torchrl

    def release(self) -> None:
        i, life = self.taken.popleft()
        if life == self._context.life[i]:
            self._context.budget[i].release()


class Inbox:
    """torchrl's result or error queue, in the trainer: whole messages from every worker's channel, never waiting
    on one worker; a retired life's message is dropped."""

    def __init__(self, context: Context, kind: int):
        self._context, self.kind = context, kind
        self.dropped = 0

    def outbox(self, i: int) -> Outbox:
        """Worker ``i``'s end."""
        context = self._context
        return Outbox(context.channels.writer(i, self.kind), context.life, exits=self.kind == ERROR and context.restarts)

    def get(self, block: bool = True, timeout: float | None = None):
        context = self._context
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = 0.0 if not block else None if end is None else max(0.0, end - time.monotonic())
            i, life, payload = context.channels.take(self.kind, left)
            if life == context.life[i]:
                obj = pickle.loads(payload)
                if self.kind == RESULT:
                    context.permits.taken.append((i, life))
                    return obj
                if context.respawner is None or not context.respawner.raised(i, obj):
                    return obj
            self.dropped += 1

    def get_nowait(self):
        return self.get(block=False)

    def close(self) -> None:
        self._context.channels.close()

    def join_thread(self) -> None:
        """Nothing to join: the trainer writes to no channel."""


class Outbox:
    """Worker ``i``'s end of the result or error queue: ``put`` sends on its own channel."""

    def __init__(self, sender: Sender, life, exits: bool):
        """``exits``: an error sent, the worker exits (its restart follows)."""
        self._sender, self._life, self._exits = sender, life, exits

    def put(self, obj, block: bool = True, timeout: float | None = None) -> None:
        me = self._sender.i
        if self._sender.kind == RESULT:
            self._sender.send_later(self._life[me], obj)
            return
        if self._exits:
            slots.failed(repr(obj))
        self._sender.send(self._life[me], obj)
        if self._exits:
            os._exit(1)  # the error is out


class _Worker:
    """What torchrl holds of env worker ``i``: its current process, alive as far as torchrl needs to know."""

    def __init__(self, respawner: Respawner, i: int):
        self._respawner, self._i = respawner, i

    @property
    def _proc(self):
        return self._respawner.procs[self._i]

    def is_alive(self) -> bool:
        return self._respawner.alive(self._i)

    def __getattr__(self, name: str) -> Any:  # pid, exitcode, name, join, terminate, kill, close
        return getattr(self._proc, name)


class Respawner:
    """Restarts the async env workers of a subcollector when the run's port decides it (:meth:`supervise`)."""

    def __init__(self, collector, context: Context, plan: dict[str, Any], on_restart: Callable[[int, int], None]):
        """``on_restart(c, k)``: subcollector ``c``'s workers start again, in life ``k``."""
        self.collector, self.context, self.on_restart = collector, context, on_restart
        self.where: list[tuple[int, int]] = [(sub["index"], row["index"]) for sub in plan["subcollectors"]
                                             for row in sub["workers"]]
        self.groups = {sub["index"]: [i for i, (c, _) in enumerate(self.where) if c == sub["index"]]
                       for sub in plan["subcollectors"]}
        self.port: RestartPort | None = None
        self.live = True
        self.starting: dict[int, int] = {}  # subcollector -> the restart it is starting
        self.lives = {c: 0 for c in self.groups}  # each subcollector's current worker life
        self.asking = False  # the trainer waits for a batch
        self._owing: dict[int, tuple[int, Any]] = {}  # subcollector -> (life, its beats file's slot 0, mapped)
        self._guard = threading.RLock()
        self.run = RunDir.current()  # built in the run's launch window
        workers = boundary.async_workers(collector)
        self.procs = list(workers)
        workers[:] = [_Worker(self, i) for i in range(len(workers))]
        context.respawner = self
        self._stopping, self._stop_keeper = os.pipe()  # readable: the keeper ends
        self._keeper = threading.Thread(target=self._keep, name="topo-async-keeper", daemon=True)
        self._keeper.start()

    def supervise(self, port: RestartPort) -> None:
        self.port = port
        port.permits(self.has_permit)

    def has_permit(self, c: int, w: int) -> bool | None:
        """Whether env worker ``w`` of ``c`` may send a result now: a permit left in its life's budget (None: unknown,
        its budget not made yet). One with none waits for the trainer, not a hang."""
        budget = self.context.budget[self.groups[c][w]]
        return None if budget is None else budget.get_value() > 0

    def stop(self) -> None:
        """The run ends: torchrl's shutdown sees the processes as they are; the beats files are unmapped."""
        if not self.live:
            return
        self.live = False
        os.write(self._stop_keeper, b"!")
        self._keeper.join()
        os.close(self._stopping)
        os.close(self._stop_keeper)
        for _, stamp in self._owing.values():
            stamp.close()
        self._owing.clear()

    def owed(self, on: bool) -> None:
        """The trainer waits for a batch (``on``), or has it: stamped in each subcollector's beats file (slot 0)."""
        if self.run is None or not self.live:
            return
        self.asking = on
        for c in self.lives:
            self._stamp(c, on)

    def _stamp(self, c: int, on: bool) -> None:
        life = self.lives[c]
        held_life, stamp = self._owing.get(c, (None, None))
        if held_life != life:
            fresh = heartbeat.asker(self.run.path, c, life)
            if fresh is None:
                return
            if stamp is not None:
                stamp.close()
            self._owing[c] = (life, fresh)
            stamp = fresh
        stamp.start() if on else stamp.end()

    def between_batches(self) -> None:
        """The run's health budgets (a worker past one: its subcollector is rebuilt at the next check)."""
        if self.port is not None and self.live:
            with self._guard:
                self.port.between_batches()

    def alive(self, i: int) -> bool:
        proc = self.procs[i]
        if self.port is None or not self.live:
            return proc.is_alive()
        with self._guard:
            self.port.tick()
            c = self.where[i][0]
            if self.port.lost(c):
                self._begin(c)
            elif c not in self.starting and not proc.is_alive():  # a start's deaths: the monitor's to judge
                self._judge(i, proc)
                self._begin(c)
        return True

    def raised(self, i: int, error: BaseException) -> bool:
        """Worker ``i`` sent ``error`` (its step loop raised): True once its restart began (its error is the
        restart's cause); the run's failure raised otherwise."""
        if self.port is None or not self.live:
            return False
        with self._guard:
            c, w = self.where[i]
            self.port.judge(c, self.port.blame(lambda s: failures.worker_ended(s, c, w, f"raised: {error}", time.time())))
            self._begin(c)
        return True

    def _judge(self, i: int, proc) -> None:
        c, w = self.where[i]
        proc.join(0.1)
        how = processes.describe_exitcode(proc.exitcode)
        self.port.judge(c, self.port.blame(lambda s: failures.worker_ended(s, c, w, how, time.time())))

    def _begin(self, c: int) -> None:
        """Restart the env workers of subcollector ``c`` (decided by the run): its restart's rows, same slots."""
        start = self.port.begin(c)
        ids = self.groups[c]
        for i in ids:
            if self.procs[i].is_alive():
                os.kill(self.procs[i].pid, signal.SIGKILL)
        for i in ids:
            self.procs[i].join()
        self._give_back(ids)
        if self.run is not None:
            heartbeat.create(self.run.path, c, start.restart, len(ids))
        with start.window:
            for i, row in zip(ids, start.rows):
                proc = self.context.start(i, {**self.context.made[i]["kwargs"], "create_env_kwargs": row["kwargs"]})
                proc.start()
                self.procs[i] = proc
        self.starting[c] = self.lives[c] = start.restart
        if self.asking and self.run is not None:  # the batch asked for before: owed by the new life too
            self._stamp(c, True)
        self.on_restart(c, start.restart)

    def _give_back(self, ids: list[int]) -> None:
        """What the dead workers ``ids`` held: the part of a message in their channel, their slot's unclaimed post
        (their permits go with their life)."""
        transport = boundary.async_transport(self.collector)
        for i in ids:
            self.context.life[i] += 1
            self.context.channels.forget(i)
            transport.forget(i)
            boundary.forget_trajectory(self.collector, i)

    def _keep(self) -> None:
        """A thread: sees a restart's workers built (the subcollector collects: its hangs are watched from then on),
        whatever the trainer's thread does between batches."""
        while self.live:
            select.select([self._stopping], [], [], KEEP_S)
            with self._guard:
                if self.live and self.port is not None:
                    for c in list(self.starting):
                        self._poll(c)

    def _poll(self, c: int) -> None:
        if self.port.built(c):
            del self.starting[c]
            self.port.instantiated(c)
