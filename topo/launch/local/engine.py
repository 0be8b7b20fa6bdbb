"""The local engine: torchrl's multi-process collector over the plan's subcollectors, on this machine.

Each subcollector process builds its env from :func:`topo.launch.subcollector.env_factory` (as a Ray actor
does); :class:`LocalEngine` runs in the trainer.
"""
from __future__ import annotations

import functools
from typing import Any

from topo.launch import forkserver
from topo.launch.subcollector import env_factories, env_factory


class LocalEngine:
    """``MultiSyncCollector`` or ``MultiAsyncCollector`` over the plan's subcollectors, on this machine,
    able to restart one of them (:mod:`.respawn`) unless ``restarts`` is False (torchrl's own classes then)."""

    name = "local"
    weight_sync = None  # the spec's policy.weight_sync
    forkserver_address: str | None = None  # the address of the run's forkserver, where env workers start too
    owns_forkserver = False  # subcollectors start from this process's forkserver, started for the run

    def __init__(self, restarts: bool = True):
        self.capabilities = frozenset({"weight_updates", *(("restarts", "collector_acks") if restarts else ())})

    def check(self, plan: dict[str, Any]) -> None:
        """Nothing to reach."""

    def connect(self, plan: dict[str, Any]) -> None:
        """Nothing to join."""

    def disconnect(self) -> None:
        """Nothing to leave."""

    def set_eval_round(self, collector, number: int) -> None:
        """The env workers read the run directory itself."""

    def build(self, plan: dict[str, Any], **kwargs: Any):
        """The collector; ``kwargs`` hold the policy arguments and the caller's torchrl options.

        torchrl's multi collectors take no start method and use the global one: the caller sets it
        (and restores its own afterwards). With ``forkserver`` the run's forkserver starts here, with the
        caller's environment (:mod:`topo.launch.forkserver`).
        """
        if "restarts" in self.capabilities:
            from topo.launch.local.respawn import RespawningAsyncCollector as Async, RespawningSyncCollector as Sync
        else:
            from torchrl.collectors import MultiAsyncCollector as Async, MultiSyncCollector as Sync

        self.plan = plan
        if plan["start_methods"]["subcollectors"] == "forkserver":
            address = forkserver.start(forkserver.preload(plan))
            self.owns_forkserver = True
            self.forkserver_address = address if forkserver.shared(plan) else None
        cls = Sync if plan["collector"]["sync"] else Async
        return cls(env_factories(plan, self.forkserver_address), frames_per_batch=plan["collector"]["frames_per_batch"],
                   total_frames=plan["collector"]["total_frames"], **kwargs)

    def supervise(self, collector, port) -> None:
        """Hand the collector the run's side of restarts (:class:`~topo.launch.supervision.port.RestartPort`) and
        how a restart builds its env from its rows."""
        collector.supervise(port, functools.partial(env_factory, self.plan, forkserver=self.forkserver_address))

    def shutdown(self, collector, timeout: float) -> list[int | None]:
        """Close the envs and subcollector processes within ``timeout``; their exit codes (None: unknown)."""
        collector.shutdown(timeout=timeout, raise_on_error=False)
        if self.owns_forkserver:
            forkserver.end()
        return [_exit_code(p) for p in getattr(collector, "procs", [])]


def _exit_code(proc) -> int | None:
    try:
        return proc.exitcode
    except ValueError:  # torchrl already shut down and closed it (after a subcollector failed)
        return None
