"""Ends that Python would print as tracebacks but that are expected: a process whose peer died.

When an env worker is killed, its subcollector's loop raises on the broken pipe; when a subcollector is killed, each
of its env workers raises on its pipe's end; a process sharing a file descriptor (torch's shared tensors go through
multiprocessing's resource sharer) with one that died sees its connection reset. The trainer names the death that
caused them (a pidfd's time, exact blame) and restarts or fails the run from it, so these tracebacks say nothing
new: they go to ``RUN_DIR/tracebacks/`` and the process exits 1 as it would have (:func:`run_quietly`), or are
dropped (:func:`quiet_fd_sharing`). Any other error is raised and printed as before.
"""
from __future__ import annotations

import sys
import traceback
from typing import Any, Callable

from topo.runtime.rundir import RunDir

_PEER_GONE = (ConnectionError, EOFError)  # reset, refused, broken pipe; a pipe's end closed
_WIRES = ("multiprocessing/connection.py", "multiprocessing/resource_sharer.py")  # where any OSError is the wire's


def ended_by_a_peer(exc: BaseException | None, found_dead: tuple[str, ...] = ()) -> bool:
    """``exc`` or an exception it was raised from is a peer's death: a pipe or socket closed, reset or refused, an
    error of multiprocessing's connections or file-descriptor sharing, torchrl's "At least one process failed", or
    anything raised in a function named in ``found_dead`` (one that runs once a peer was found dead)."""
    for _ in range(16):
        if exc is None:
            return False
        if isinstance(exc, _PEER_GONE) or (isinstance(exc, OSError) and _through(exc.__traceback__, _WIRES)) or (
                isinstance(exc, RuntimeError) and str(exc).startswith("At least one process failed")) or (
                found_dead and _in(exc.__traceback__, found_dead)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def run_quietly(role: str, call: Callable[[], Any], found_dead: tuple[str, ...] = ()) -> Any:
    """``call()`` as a run's process ``role`` runs it: ended by a peer's death (:func:`ended_by_a_peer`), its
    traceback is written to the run directory and the process exits 1, without a word on stderr."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - re-raised unless a peer died
        run = RunDir.current()
        if run is None or not ended_by_a_peer(exc, found_dead):
            raise
        run.write("tracebacks", role, traceback=traceback.format_exc())
        sys.exit(1)


def quiet_fd_sharing() -> None:
    """In this process, from now on: multiprocessing's resource sharer, whose thread hands ``sys.excepthook`` what
    it fails on and goes on serving, says nothing when a peer died while fetching a file descriptor; every other
    error is printed as before."""
    previous = sys.excepthook
    if getattr(previous, "topo_quiet", False):
        return

    def hook(exc_type, exc, tb) -> None:
        if issubclass(exc_type, (OSError, EOFError)) and _through(tb, _WIRES[1:]):
            return
        previous(exc_type, exc, tb)

    hook.topo_quiet = True
    sys.excepthook = hook


def _in(tb, functions: tuple[str, ...]) -> bool:
    """The traceback ``tb`` runs through a function named in ``functions``."""
    while tb is not None:
        if tb.tb_frame.f_code.co_name in functions:
            return True
        tb = tb.tb_next
    return False


def _through(tb, files: tuple[str, ...]) -> bool:
    """The traceback ``tb`` runs through one of ``files`` (path endings)."""
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(files):
            return True
        tb = tb.tb_next
    return False
