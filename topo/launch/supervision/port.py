"""The one restart port: what an engine asks of the run about its subcollectors (the run decides; the engine acts).

Both engines use it, the local one from inside torchrl's process checks (:mod:`topo.launch.local.respawn`), the
Ray one from its iterator (:mod:`topo.launch.ray.engine`); :class:`~topo.launch.supervision.recovery.Recovery`
is the run's side. A restart crosses it as plain data (:class:`Restarting`): the engine builds the env from
the rows itself (:func:`topo.launch.subcollector.env_factory`). Imports neither torch nor torchrl.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Protocol

from topo.launch.supervision.failure import Failure
from topo.launch.supervision.state import RunState
from topo.compiler.row import Row


@dataclass(frozen=True)
class Restarting:
    """A decided restart about to begin: its number, its plan rows (the restart's seeds), the policy factory of
    its new start (None: the first start's) and the launch window it starts in."""

    restart: int
    rows: list[Row]
    policy_factory: Callable | None
    window: ContextManager


class RestartPort(Protocol):
    """The run's answers to an engine, for subcollector ``c``."""

    @property
    def bell(self) -> int:
        """A file descriptor, readable when a verdict was reached: the engine stops waiting and checks."""

    def tick(self) -> None:
        """Raise the run's failure, if any; end retired processes whose grace passed."""

    def lost(self, c: int) -> bool:
        """A restart of ``c`` was decided and has not begun."""

    def settle(self, c: int, pid: int | None, exitcode: int | None) -> None:
        """``c``'s process ended: return once a restart is decided, raise the run's failure otherwise."""

    def judge(self, c: int, seen: Failure, *, first_records: bool = True) -> None:
        """The engine saw ``c`` fail (``seen``): return once a restart is decided, raise the run's failure otherwise."""

    def blame(self, build: Callable[[RunState], Failure]) -> Failure:
        """A failure built from the run's records (its rows, restarts and deaths), as :mod:`.failure` builds one."""

    def begin(self, c: int, old: Any = None) -> Restarting:
        """The decided restart of ``c`` begins; ``old``: its previous process, retired here (None: the engine ends it)."""

    def poll_ready(self, c: int, restart: int, pipe: Any, proc: Any) -> str:
        """``"ready"``, ``"waiting"`` or ``"lost"`` for a local restart that starts (its pipe and process)."""

    def built(self, c: int) -> bool:
        """Every env worker of ``c``'s current start has built its env (an engine whose workers the trainer starts)."""

    def instantiated(self, c: int) -> None:
        """The restart of ``c`` collects: its envs are built, its policy has the weights."""

    def asked(self, c: int) -> None:
        """``c`` was asked for a batch (from now on it owes one)."""

    def permits(self, has_permit: Callable[[int, int], bool | None]) -> None:
        """``has_permit(c, w)``: whether env worker ``w`` of ``c`` may send a result now (async mode: a result permit
        left in its budget; None: unknown). The hang rule then finds a worker idle while it could send."""

    def between_batches(self) -> None:
        """The trainer asked for the next batch (health budgets: a subcollector may be rebuilt)."""

    def running_free(self, on: bool) -> None:
        """The subcollectors fill the replay buffer in the background (``on``), or stop: meanwhile the run's
        failure interrupts the trainer wherever it is."""

    def waiting(self) -> ContextManager:
        """A wait of the trainer inside the engine (a pause): the run's failure interrupts it."""

    def failed(self, exc: BaseException) -> None:
        """The engine's own thread raised ``exc``: the run fails with it (the trainer is told as of any failure)."""

    def abandon(self, c: int, proc: Any) -> None:
        """The run ends while ``c``'s restart (process ``proc``) starts."""

    def current_weights(self) -> Any:
        """The weights a restarted subcollector's policy starts from (None: its factory's)."""
