"""What a SIGKILLed process left held of multiprocessing's locks and events, given back by a process that shares them.

A process killed inside ``Lock.acquire ... release`` leaves the lock taken for good; one killed while it waits on an
``Event`` leaves the event's condition counting a sleeper that never wakes, and the next ``set()`` (from any process)
waits for that sleeper forever (CPython's ``multiprocessing.synchronize.Condition.notify``). Both are given back here,
once the holder is known dead, by the semaphores' values (Linux). Torch-free.
"""
from __future__ import annotations

import time

WAIT_S = 0.2  # how long a live process may hold one of these locks (they guard a few instructions)


def free_lock(lock, wait: float = WAIT_S) -> bool:
    """Release ``lock`` when nobody alive can be holding it: its users hold it for a few instructions, so a lock
    not free within ``wait`` seconds is the dead process's. True when it was given back."""
    if lock.acquire(True, wait):
        lock.release()
        return False
    _give_back(lock)
    return True


def free_event(event, wait: float = WAIT_S, limit: float = 5.0) -> bool:
    """Make ``event`` usable again after the one process that waited on it died; the others only ``set()`` it.

    With the condition's lock taken: the dead sleeper's counts are dropped, as ``notify`` would, had it woken. A lock
    not free within ``wait``: either a ``set()`` woke the dead sleeper and waits for it (its wake-up semaphore was
    released: the sleeper's "woken" is given in its stead), or the dead process held the lock (it is released).
    True when anything was given back."""
    cond = event._cond
    lock, sleeping, woken, wake = cond._lock, cond._sleeping_count, cond._woken_count, cond._wait_semaphore
    given = False
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if lock.acquire(True, wait):
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
        given = True
        _give_back(woken if wake._semlock._get_value() > 0 else lock)
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
