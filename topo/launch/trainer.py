"""The trainer's process state while a run lives in it: what a run changes, and puts back.

- :class:`TrainerState`: start method, torch threads and signal handlers, saved at start and restored;
  SIGTERM and SIGHUP raised as :class:`Signalled` (a BaseException no ``except Exception`` swallows);
- :func:`launch_window`: what the processes started meanwhile inherit (the run directory, start slots,
  a restart's number, GL held off, optionally this process's stdout/stderr as a log file);
- :data:`TRAINER_VAR`: set while the run starts processes, so that an env factory called here refuses.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from typing import Callable, Iterator

from topo.runtime import gl
from topo.runtime.episodes import RECORD_VAR, RETAIN_VAR
from topo.runtime.rundir import RESTART_VAR, RUN_DIR_VAR, SLOTS_VAR

TRAINER_VAR = "TOPO_TRAINER_PID"


class Signalled(BaseException):
    """SIGTERM or SIGHUP: a BaseException, so that no ``except Exception`` in a training loop swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def raise_signalled(signum, frame):
    raise Signalled(signum)


def ignore_signal(signum, frame):
    pass


class TrainerState:
    """What a run changes in the trainer process, saved at start and put back at the end."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, start_method: str | None, threads: int | None, handlers: dict):
        self.start_method = start_method
        self.threads = threads
        self.handlers = handlers

    @classmethod
    def save(cls) -> TrainerState:
        threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        main = threading.current_thread() is threading.main_thread()
        handlers = {s: signal.getsignal(s) for s in (*cls.SIGNALS, signal.SIGINT)} if main else {}
        return cls(multiprocessing.get_start_method(allow_none=True), threads, handlers)

    def catch(self, handler) -> None:
        """Route SIGTERM and SIGHUP to ``handler`` where the trainer left them at their default (and SIGINT
        too when ``handler`` ignores: teardown runs to its end, it is bounded)."""
        for s in self.SIGNALS:
            if s in self.handlers and self.handlers[s] in (signal.SIG_DFL, None):
                signal.signal(s, handler)
        if handler is ignore_signal and signal.SIGINT in self.handlers:
            signal.signal(signal.SIGINT, handler)

    def restore(self) -> None:
        multiprocessing.set_start_method(self.start_method, force=True)
        if self.threads is not None:
            sys.modules["torch"].set_num_threads(self.threads)
        for s, handler in self.handlers.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def launch_window(run_path: str, *, max_concurrent_starts: int | None = None, process_logs: bool = False,
                  restart: int = 0, record: str = "episodes", retain: int | None = None) -> Iterator[None]:
    """What the processes started now inherit: the run directory, start slots, the restart number of a
    subcollector started again, what env workers record (episodes, also their actions, or nothing) and keep (``retain``), GL held off (:mod:`topo.runtime.gl`),
    this process's output as ``processes.log``."""
    values = {RUN_DIR_VAR: run_path, TRAINER_VAR: str(os.getpid()), RECORD_VAR: record, RETAIN_VAR: str(retain or "")}
    if max_concurrent_starts:
        values[SLOTS_VAR] = str(max_concurrent_starts)
    if restart:
        values[RESTART_VAR] = str(restart)
    held = gl.HELD_VAR not in os.environ
    gl.hold()
    logs = log_to(os.path.join(run_path, "processes.log")) if process_logs else None
    try:
        with environ(values):
            yield
    finally:
        if logs is not None:
            logs()
        if held:
            gl.release()


def log_to(path: str) -> Callable[[], None]:
    """This process's stdout and stderr into ``path`` (processes started now inherit them); returns the undo."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)

    def undo() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for target, original in zip((1, 2), saved):
            os.dup2(original, target)
            os.close(original)

    return undo


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, each variable put back as it was afterwards."""
    saved = {var: os.environ.get(var) for var in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
