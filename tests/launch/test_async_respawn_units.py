"""What an async env worker's death leaves, given back, with real processes SIGKILLed: a lock and an event it held
(:mod:`topo.runtime.held`), the result permits it held and the messages of its retired life (:mod:`topo.launch.async_mode.respawn`)."""
from __future__ import annotations

import multiprocessing
import os
import queue
import signal
import threading
import time

import pytest

from topo.launch import boundary
from topo.launch.async_mode import respawn as async_respawn
from topo.runtime import held

CTX = multiprocessing.get_context("spawn")


def _wait_on(event) -> None:
    while True:
        event.wait(0.1)


def _hold(lock) -> None:
    lock.acquire()
    time.sleep(600)


def _killed(target, arg):
    """``target(arg)`` in a process, SIGKILLed once it waits on the event or holds the lock ``arg``."""
    proc = CTX.Process(target=target, args=(arg,), daemon=True)
    proc.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (_inside_wait(arg) if target is _wait_on else _taken(arg)):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    return proc


def _inside_wait(event) -> bool:
    cond = event._cond
    return cond._sleeping_count._semlock._get_value() > cond._woken_count._semlock._get_value()


def _taken(lock) -> bool:
    if lock.acquire(False):
        lock.release()
        return False
    return True


def _sets(event, timeout: float = 2.0) -> bool:
    """Whether ``event.set()`` returns within ``timeout`` (from a thread: a blocked one is left behind, daemon)."""
    setter = threading.Thread(target=event.set, daemon=True)
    setter.start()
    setter.join(timeout)
    return not setter.is_alive()


@pytest.mark.parametrize("dies", ["waiting", "holding its lock"])
@pytest.mark.parametrize("set_before", [False, True])
def test_an_event_whose_only_waiter_was_killed_can_be_set_again(dies, set_before):
    event = CTX.Event()
    _killed(_wait_on if dies == "waiting" else _hold, event if dies == "waiting" else event._cond._lock)
    if set_before:
        assert not _sets(event, 0.5)  # the setter waits for the dead (python's Condition.notify), or for its lock
    assert held.free(events=[event], held=1.0)
    assert _sets(event) and _sets(event)
    event.clear()
    waiter = CTX.Process(target=_wait_on, args=(event,), daemon=True)  # a new waiter, as a restarted worker
    waiter.start()
    try:
        time.sleep(0.5)
        assert _sets(event) and _sets(event)
    finally:
        waiter.kill()
        waiter.join()


def _woken_silent(event) -> None:
    """Sleep on ``event`` as ``Condition.wait`` does, take the wake-up of the next ``set()``, never say so."""
    cond = event._cond
    cond._lock.acquire()
    cond._sleeping_count.release()
    cond._lock.release()
    cond._wait_semaphore.acquire()
    time.sleep(600)


def test_an_event_whose_waiter_died_woken_before_saying_so_can_be_set_again():
    """The one window a dead waiter leaves inside ``Condition.wait``: it took the wake-up of a ``set()`` and died
    before counting itself woken; the ``set()`` waits for it, holding the event's lock. It goes on once freed."""
    event = CTX.Event()
    proc = CTX.Process(target=_woken_silent, args=(event,), daemon=True)
    proc.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _inside_wait(event):
        time.sleep(0.01)
    setter = threading.Thread(target=event.set, daemon=True)
    setter.start()
    wake = event._cond._wait_semaphore._semlock
    while time.monotonic() < deadline and not (_taken(event._cond._lock) and wake._get_value() == 0):
        time.sleep(0.01)  # the set() holds the lock, its wake-up taken: it waits for the waiter to say so
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    setter.join(0.5)
    assert setter.is_alive()  # the set() waits for the dead
    assert held.free(events=[event], held=1.0)
    setter.join(5)
    assert not setter.is_alive() and event.is_set()
    event.clear()
    assert _sets(event) and _sets(event)


def test_an_event_nobody_left_holding_is_untouched():
    event = CTX.Event()
    assert not held.free(events=[event])
    assert _sets(event) and event.is_set()


def test_a_lock_its_dead_holder_kept_is_given_back_and_a_free_one_is_not():
    lock = CTX.Lock()
    assert not held.free(locks=[lock], held=1.0)
    _killed(_hold, lock)
    assert held.free(locks=[lock], held=1.0)
    assert lock.acquire(True, 1.0)  # this process owns it now (given back through a handle of its own)
    lock.release()


def _hold_all(locks) -> None:
    for lock in locks:
        lock.acquire()
    time.sleep(600)


def test_what_a_dead_process_held_of_several_is_given_back_on_one_clock():
    """A process killed holding two events' locks and a lock: all three given back once ``held`` passed, not one
    ``held`` after the other (each event then sets, the lock is free)."""
    first, second, lock = CTX.Event(), CTX.Event(), CTX.Lock()
    locks = [first._cond._lock, second._cond._lock, lock]
    proc = CTX.Process(target=_hold_all, args=(locks,), daemon=True)
    proc.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(_taken(each) for each in locks):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    began = time.monotonic()
    assert held.free([first, second], [lock], held=1.0)
    assert time.monotonic() - began < 3.0  # 1 s held, 1 s for a set() to take a "woken": together (in turn: 5 s)
    assert _sets(first) and _sets(second) and not _taken(lock)


def _worker(permits, results, chunks: int, begun) -> None:
    """An async env worker's use of the permits and the result queue: ``chunks`` sent, one more begun."""
    for n in range(chunks):
        assert permits.acquire(timeout=5)
        results.put({"chunk": n})
    assert permits.acquire(timeout=5)
    begun.set()
    time.sleep(600)


def test_a_dead_workers_permits_come_back_and_its_retired_life_is_dropped():
    context = async_respawn.Context(CTX, 2)
    results = context.Queue(maxsize=4)
    permits = context.BoundedSemaphore(4)
    begun = CTX.Event()
    proc = CTX.Process(target=_worker, args=(permits, results, 2, begun), name=f"{boundary.ASYNC_WORKER_PREFIX}1",
                       daemon=True)
    proc.start()
    assert results.get(timeout=60) == {"chunk": 0}
    permits.release()  # the trainer's, on receipt
    assert begun.wait(30)  # chunk 1 sent, chunk 2 begun
    assert results._reader.poll(30)  # chunk 1 through the queue's feeder thread, in the pipe
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert list(context.held) == [0, 1]
    assert permits.give_back(1) == 1 and list(context.held) == [0, 0]
    context.life[1] += 1  # its restart: chunk 1, still queued, belongs to the retired life
    with pytest.raises(queue.Empty):  # chunk 1 dropped, its permit given back
        results.get(timeout=1.0)
    assert results.dropped == 1
    assert all(permits.acquire(timeout=0) for _ in range(4)) and not permits.acquire(timeout=0)  # all 4 back
