"""The engines that run a plan's subcollectors, behind one protocol: ``local`` processes or ``ray`` actors.

A run (:mod:`.session`) asks an engine what it can do (:attr:`Engine.capabilities`) rather than which
engine it is. Adding an engine: a class with these members, chosen in :func:`engine_for`.
"""
from __future__ import annotations

from typing import Any, Protocol

from topo.compiler.plan import engine

class Engine(Protocol):
    """``capabilities``: ``restarts`` (its collector restarts a subcollector in place: launch.restarts,
    hang_timeout), ``weight_updates`` (the trainer's weights reach every acting copy: run.update_weights),
    ``collector_acks`` (the collector waits for each weight acknowledgement itself, so a scheme need not),
    ``serves_policy`` (its collector starts the policy server itself: the run gives it the policy setup, no placement),
    ``runs_nodes`` (each of its nodes runs its rows as one machine's run: the run gives it ``node_run``, its class)."""

    name: str
    capabilities: frozenset[str]
    weight_sync: str | None  # what carries the trainer's weights to the copies, when not the spec's scheme

    def check(self, plan: dict[str, Any]) -> None:
        """Before anything starts, in the trainer (no torch): raise if the engine cannot be reached."""

    def connect(self, plan: dict[str, Any]) -> None:
        """Before the policy server and the collector start: join what runs them (a Ray cluster)."""

    def build(self, plan: dict[str, Any], **kwargs: Any) -> Any:
        """The collector the trainer iterates; ``kwargs`` hold the policy arguments and torchrl options."""

    def set_eval_round(self, collector: Any, number: int) -> None:
        """After the run directory holds eval round ``number`` (negative: that round ended,
        :func:`topo.runtime.rundir.set_eval_round`): make every env worker see it (no-op where they read that
        directory)."""

    def supervise(self, collector: Any, recovery: Any) -> None:
        """Hand the collector the run's side of restarts (engines with ``restarts`` only)."""

    def shutdown(self, collector: Any, timeout: float) -> list[int | None]:
        """Close every env and subcollector within ``timeout``; their exit codes (None: unknown)."""

    def disconnect(self) -> None:
        """Last, after the policy server too: leave what :meth:`connect` joined (what is left of the run ends)."""


def engine_for(plan: dict[str, Any], *, restarts: bool = True) -> Engine:
    """The engine the plan's ``placement.engine`` names; ``restarts``: whether the installed torchrl allows
    restarting a subcollector in place (:mod:`.boundary`)."""
    if plan["collector"].get("mode") == "async" and engine(plan) == "ray":
        from topo.launch.ray import RayAsyncEngine

        return RayAsyncEngine()
    if plan["collector"].get("mode") == "async":
        from topo.launch.async_mode import AsyncEngine

        return AsyncEngine()
    if engine(plan) == "ray":
        from topo.launch.ray import RayEngine

        return RayEngine(restarts=restarts)
    from topo.launch.local import LocalEngine

    return LocalEngine(restarts=restarts)
