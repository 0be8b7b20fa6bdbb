"""What a run's processes register with multiprocessing's resource tracker, kept so that the trainer can release
what a dead one left.

Every process of a run shares the trainer's resource tracker, which unlinks a name only when the last process
holding it ends: the semaphores of a subcollector killed by a restart stay in ``/dev/shm`` for the rest of the run,
and at its end Python warns of "leaked semaphore objects". Each subcollector and env worker appends what it
registers and unregisters to ``RUN_DIR/resources/PID`` (:func:`keep`); once that process is dead, the trainer
unlinks what it still held and unregisters it from the tracker (:func:`release`): nothing is left, nothing warned.
"""
from __future__ import annotations

import os

from topo.runtime.live import running

FOLDER = "resources"


def keep(run_dir: str) -> None:
    """In a run's process, from now on: note each register and unregister in the process's file (a forked child
    inherits this and writes its own)."""
    from multiprocessing import resource_tracker as rt

    if getattr(rt.register, "topo_keeps", False):
        return
    folder = os.path.join(run_dir, FOLDER)
    os.makedirs(folder, exist_ok=True)
    register, unregister = rt.register, rt.unregister

    def note(sign: str, name: str, rtype: str) -> None:
        try:
            with open(os.path.join(folder, str(os.getpid())), "a") as f:
                f.write(f"{sign} {rtype} {_tracker()} {name}\n")
        except OSError:
            pass

    def keeping_register(name: str, rtype: str) -> None:
        register(name, rtype)  # starts the tracker if needed: its pipe is known after
        note("+", name, rtype)

    def keeping_unregister(name: str, rtype: str) -> None:
        unregister(name, rtype)
        note("-", name, rtype)

    keeping_register.topo_keeps = True
    rt.register, rt.unregister = keeping_register, keeping_unregister


def release(run_dir: str, pid: int) -> int:
    """Unlink what dead process ``pid`` registered and did not unregister, and unregister it from this process's
    tracker when it was that one; and the ``/dev/shm/torch_PID_*`` files it left (torch names a shared tensor's
    file after its maker and unlinks it once opened: a process killed between the two leaves it). The names
    released."""
    released = _torch_files(pid)
    path = os.path.join(run_dir, FOLDER, str(pid))
    if not os.path.exists(path):
        return released
    held: dict[str, tuple[str, str]] = {}
    for sign, rtype, tracker, name in entries(path):
        if sign == "+":
            held[name] = (rtype, tracker)
        else:
            held.pop(name, None)
    from multiprocessing import resource_tracker as rt

    ours = _tracker()
    for name, (rtype, tracker) in held.items():
        unlink = _unlink(rtype)
        if unlink is None:
            continue
        try:
            unlink(name)
        except OSError:
            pass  # already gone
        if tracker == ours != "none":  # registered first: a process killed between its own unregister and its
            rt.register(name, rtype)   # ledger's "-" was released already, and a second unregister alone makes
            rt.unregister(name, rtype)  # the tracker print a KeyError traceback (a name is held once: a set)
        released += 1
    try:
        os.remove(path)
    except OSError:
        pass
    return released


def entries(path: str) -> list[tuple[str, str, str, str]]:
    """A process's ledger file, in order: (``+`` or ``-``, resource type, tracker, name) for each line."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    return [tuple(parts) for parts in (line.split(" ", 3) for line in lines) if len(parts) == 4]


def release_all(run_dir: str) -> int:
    """:func:`release` every process of the run with a file that is no longer alive on this host."""
    folder = os.path.join(run_dir, FOLDER)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return sum(release(run_dir, int(name)) for name in names if name.isdigit() and not running(int(name)))


def _torch_files(pid: int, folder: str = "/dev/shm") -> int:
    """Unlink the shared-memory files torch made in dead process ``pid``; how many."""
    prefix, gone = f"torch_{pid}_", 0
    try:
        names = [name for name in os.listdir(folder) if name.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))
            gone += 1
        except OSError:
            pass  # already gone
    return gone


def _tracker() -> str:
    """This process's resource tracker, as the inode of its pipe ("none" before it has one): the same in every
    process that shares it."""
    from multiprocessing import resource_tracker as rt

    fd = getattr(getattr(rt, "_resource_tracker", None), "_fd", None)
    try:
        return str(os.fstat(fd).st_ino) if fd is not None else "none"
    except OSError:
        return "none"


def _unlink(rtype: str):
    if rtype == "semaphore":
        import _multiprocessing

        return getattr(_multiprocessing, "sem_unlink", None)
    if rtype == "shared_memory":
        import _posixshmem

        return _posixshmem.shm_unlink
    return None
