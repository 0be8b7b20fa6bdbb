"""What a SIGKILLed process left held of multiprocessing's locks and events, given back by a process that shares them.

A process killed inside ``Lock.acquire ... release`` leaves the lock taken for good; one killed while it waits on an
``Event`` leaves the event's condition counting a sleeper that never wakes, and the next ``set()`` (from any process)
waits for that sleeper forever (CPython's ``multiprocessing.synchronize.Condition.notify``). Both are given back here,
once the holder is known dead, by the semaphores' values (Linux). A lock is judged the dead's only after ``HELD_S``:
its live users hold it for a few instructions, but a loaded machine may deschedule one for a while, and releasing
a lock a live process holds would let two in. Torch-free.
"""
from __future__ import annotations

import time

HELD_S = 5.0  # held this long by nobody who moves: the dead process's
POLL_S = 0.05


def free_lock(lock, held: float = HELD_S) -> bool:
    """Release ``lock`` when nobody alive can be holding it (not free for ``held`` seconds). True when given back."""
    if lock.acquire(True, held):
        lock.release()
        return False
    _give_back(lock)
    return True


def free_event(event, held: float = HELD_S, limit: float = 30.0) -> bool:
    """Make ``event`` usable again after the one process that waited on it died; the others only ``set()`` it.

    With the condition's lock taken: the dead sleeper's counts are dropped, as ``notify`` would, had it woken. While
    a ``set()`` holds the lock having woken the dead sleeper (its wake-up semaphore released, nobody to take it), the
    sleeper's "woken" is given in its stead. A lock held ``held`` seconds otherwise is the dead process's: released.
    True when anything was given back."""
    cond = event._cond
    lock, sleeping, woken, wake = cond._lock, cond._sleeping_count, cond._woken_count, cond._wait_semaphore
    given = False
    end = time.monotonic() + limit
    stuck = None  # since when the lock is held with nobody woken
    while time.monotonic() < end:
        if lock.acquire(True, POLL_S):
            try:
                while woken.acquire(False):
                    sleeping.acquire(False)
                while sleeping.acquire(False):
                    given = True
                while wake.acquire(False):
                    pass
            finally:
                lock.release()
            return given
        if wake._semlock._get_value() > 0:  # a set() waits for the dead sleeper it woke
            _give_back(woken)
            given, stuck = True, None
        elif stuck is None:
            stuck = time.monotonic()
        elif time.monotonic() - stuck >= held:
            _give_back(lock)
            given, stuck = True, None
    raise TimeoutError(f"an event a dead process used stayed held for {limit:g}s")


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
