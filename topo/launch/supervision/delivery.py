"""How the run's failure reaches the trainer: one route, one error.

The monitor's thread alone decides what failed (:meth:`~.monitor.Monitor.judge`) and hands the failure
to :meth:`Delivery.deliver`. From then on the trainer gets one :class:`~topo.errors.LaunchError` for it,
:meth:`Delivery.error`, wherever it is:

- inside topo's waits (the collector's constructor and iterator, a weight update: :meth:`interruptible`),
  it is woken by SIGINT in the main thread and raises the error on the way out; while the collector fills a
  replay buffer in the background (torchrl's ``start()``: :meth:`background`), wherever the trainer is;
- when torchrl asks after its processes (:mod:`.respawn`), :meth:`raise_if_failed` raises it;
- when torchrl raised first (it saw a dead process), :meth:`classify` waits up to ``SETTLE_S`` for the
  failure behind it and raises that instead.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time
from typing import Iterator

from topo.errors import Interrupted, LaunchError, TopoError
from topo.launch.supervision import failure as failures
from topo.launch.trainer import Signalled

SETTLE_S = 2.0  # after torchrl raises: time for the monitor to see the death or record behind it


class Aborted(BaseException):
    """The monitor found a failure while the trainer waited inside topo (a signal brought it here)."""


class Delivery:
    def __init__(self) -> None:
        self.failure: failures.Failure | None = None
        self._error: LaunchError | None = None
        self._main = threading.main_thread().ident
        self._section = threading.Lock()
        self._in_section = 0  # how many interruptible sections the main thread is in (they nest)
        self._background: contextlib.ExitStack | None = None

    def deliver(self, found: failures.Failure) -> None:
        """In the monitor's thread: the run's failure; the trainer is woken if it waits inside topo."""
        self.failure = found
        with self._section:
            if self._in_section > 0:
                signal.pthread_kill(self._main, signal.SIGINT)

    def error(self) -> LaunchError | None:
        """The one error the trainer raises for the run's failure (None: none yet)."""
        if self._error is None and self.failure is not None:
            self._error = self.failure.error()
        return self._error

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.error()

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """While the trainer waits in topo, a failure delivered interrupts the wait (SIGINT, main thread)."""
        if threading.get_ident() != self._main:
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum, frame):
            if self.failure is not None:
                raise Aborted()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)
        with self._section:
            self._in_section += 1
        try:
            if self.failure is not None:
                raise Aborted()  # delivered while the trainer was elsewhere: do not start a wait it would end
            yield
        except Aborted:
            raise self.error() from None
        finally:
            with self._section:
                self._in_section -= 1
            signal.signal(signal.SIGINT, previous)

    def background(self, on: bool) -> None:
        """From the main thread: the collector runs free in the background (``on``) or no longer does. Meanwhile
        the trainer is in its own code, waiting on the replay buffer: the run's failure interrupts it there."""
        if on and self._background is None and threading.get_ident() == self._main:
            self._background = contextlib.ExitStack()
            self._background.enter_context(self.interruptible())
        elif not on and self._background is not None and threading.get_ident() == self._main:
            stack, self._background = self._background, None
            stack.close()

    def classify(self, exc: BaseException | None) -> tuple[BaseException | None, BaseException | None]:
        """(what the report states, what the caller raises: ``exc`` itself or topo's error for it)."""
        if exc is None:
            return None, None
        if isinstance(exc, Aborted):
            return self.error(), self.error()
        if isinstance(exc, Signalled):
            err = Interrupted(exc.signum)
            return err, err
        if isinstance(exc, KeyboardInterrupt):
            return Interrupted(signal.SIGINT), exc
        if _from_collector(exc) and not isinstance(exc, TopoError):
            deadline = time.monotonic() + SETTLE_S
            while self.failure is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.failure is None:
                self.failure = failures.collector_error(exc)
            return self.error(), self.error()
        return exc, exc  # topo's own error, or the training loop's: teardown, report, then it propagates


def _from_collector(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside torchrl or tensordict (not by the training loop's own code)."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith(("torchrl.", "tensordict.")):
            return True
        tb = tb.tb_next
    return False
