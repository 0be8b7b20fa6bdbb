"""What a SIGKILLed process left held of multiprocessing's locks and events, given back by a process that shares them.

A process killed inside ``Lock.acquire ... release`` leaves the lock taken for good; one killed while it waits on an
``Event`` leaves the event's condition counting a sleeper that never wakes, and the next ``set()`` (from any process)
waits for that sleeper forever (CPython's ``multiprocessing.synchronize.Condition.notify``). Both are given back here,
once the holder is known dead, by the semaphores' values (Linux). A lock is judged the dead's only after ``HELD_S``:
its live users hold it for a few instructions, but a loaded machine may deschedule one for a while, and releasing
a lock a live process holds would let two in. Everything asked is watched at once, on one clock. Torch-free.
"""
from __future__ import annotations

import time
from typing import Iterable

HELD_S = 5.0  # held this long by nobody who moves: the dead process's
TRY_S = 0.01  # one try at a lock
SAID_S = 1.0  # for a set() waiting on a dead sleeper to take the "woken" given in its stead


def free(events: Iterable = (), locks: Iterable = (), held: float = HELD_S, limit: float = 30.0) -> bool:
    """Make ``events`` and ``locks`` usable again after a process that used them died. True when anything was
    given back.

    An event (its one waiter, if any, was the dead process; the others only ``set()``, ``clear()`` or ask it):
    with the condition's lock taken, the dead sleeper's counts are dropped, as ``notify`` would, had it woken.
    While a ``set()`` holds the lock having woken the dead sleeper (whether the sleeper took its wake-up or not),
    the sleeper's "woken" is given in its stead. A lock (an event's, or one of ``locks``) that nobody takes for
    ``held`` seconds is the dead process's: released."""
    pending = [_Event(e) for e in events] + [_Lock(lock) for lock in locks]
    given, end = False, time.monotonic() + limit
    while pending:
        if time.monotonic() > end:
            raise TimeoutError(f"a lock a dead process used stayed held for {limit:g}s")
        for item in list(pending):
            done, gave = item.step(held)
            given |= gave
            if done:
                pending.remove(item)
    return given


def is_set(event) -> bool:
    """``event.is_set()``, without taking its lock (a dead process may hold it)."""
    return event._flag._semlock._get_value() > 0


class _Lock:
    def __init__(self, lock):
        self.lock, self.since = lock, None  # since when every try failed

    def step(self, held: float) -> tuple[bool, bool]:
        """One try: (done, given back)."""
        if self.lock.acquire(True, TRY_S):
            self.lock.release()
            return True, False
        if self.stuck(held):
            _give_back(self.lock)
            return True, True
        return False, False

    def stuck(self, held: float) -> bool:
        """Every try failed for ``held`` seconds (the clock then starts again)."""
        now = time.monotonic()
        self.since = self.since or now
        if now - self.since < held:
            return False
        self.since = None
        return True


class _Event(_Lock):
    def __init__(self, event):
        cond = event._cond
        super().__init__(cond._lock)
        self.sleeping, self.woken, self.wake = cond._sleeping_count, cond._woken_count, cond._wait_semaphore
        self.offered = None  # since when a "woken" given in a dead sleeper's stead waits to be taken

    def step(self, held: float) -> tuple[bool, bool]:
        if self.lock.acquire(True, TRY_S):
            dropped = False
            try:
                while self.woken.acquire(False):
                    self.sleeping.acquire(False)
                while self.sleeping.acquire(False):
                    dropped = True
                while self.wake.acquire(False):
                    pass
            finally:
                self.lock.release()
            return True, dropped
        if self.offered is not None:
            return False, self._taken_or_not()
        if self.wake._semlock._get_value() > 0:  # a set() waits for the dead sleeper it woke
            _give_back(self.woken)
            self.since = None
            return False, True
        if self.stuck(held):
            # Held that long, no wake-up pending: a set() waits for a sleeper that took its wake-up and died before
            # saying so, or the dead process holds the lock itself. Its "woken" is given: a waiting set() takes it
            # at once (nobody else can while the lock is held); left untaken, the lock was the dead's.
            _give_back(self.woken)
            self.offered = time.monotonic()
            return False, True
        return False, False

    def _taken_or_not(self) -> bool:
        """The "woken" given: taken (a set() goes on), or after ``SAID_S`` taken back and the lock given back."""
        if self.woken._semlock._get_value() == 0:
            self.offered = None
            return False
        if time.monotonic() - self.offered < SAID_S:
            return False
        self.offered = None
        if self.woken.acquire(False):  # nobody took it: the lock is the dead process's
            _give_back(self.lock)
            return True
        return False


def _give_back(sem) -> None:
    """Release ``sem`` (a ``Lock`` or ``Semaphore``) for another process, through a handle opened by its name:
    releasing through ``sem`` itself counts as this process's release (a later acquire here would not own the lock).
    A semaphore with no name left (a fork context's) is released through ``sem``."""
    import _multiprocessing

    semlock = sem._semlock
    if semlock.name is None:
        sem.release()
        return
    _multiprocessing.SemLock._rebuild(0, semlock.kind, semlock.maxvalue, semlock.name).release()
