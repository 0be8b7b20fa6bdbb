"""The local engine: torchrl's multi-process collector, one worker-metadata ParallelEnv per subcollector.

:func:`subcollector_env` runs inside each subcollector process; :class:`LocalEngine` in the trainer.
The parent of a ParallelEnv builds no env: workers send their metadata.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
from typing import Any

from topo.runtime import heartbeat
from topo.runtime.rundir import RunDir
from topo.launch import observe


def subcollector_env(index: int, rows: list[dict], start_method: str, launch: dict[str, Any]):
    """The env of subcollector ``index``: ``ParallelEnv`` over ``topo.worker.make_env``, one row per worker.

    Module-level so that its ``functools.partial`` over plain data pickles with any start method.
    ``serial_for_single`` stays off: a one-worker subcollector keeps its env in a worker process.
    The subcollector leads a process group of its own (its env workers join it), so a Ctrl-C in the
    trainer's terminal reaches the trainer only, which then shuts everything down in order.
    ``launch["construction"]`` other than ``workers`` rebuilds how people do it today, for ``topo bench``
    (documented in docs/reference/plan-format.md): ``homogeneous`` (one factory + kwargs, torchrl's default
    metadata: one env in this process) and ``legacy`` (one distinct callable per worker: every env once
    more in this process).
    """
    from torchrl.envs import ParallelEnv

    from topo.worker import make_env

    observe.set_subcollector(index, rows[0]["kwargs"].get("backend") if rows else None)
    run = RunDir.current()
    if run is not None:
        if os.getpid() != os.getpgid(0):
            os.setpgid(0, 0)
        run.marker("subcollector", index=index, start_method=multiprocessing.get_start_method())
        heartbeat.open_subcollector(run, index, len(rows))
    if start_method == "forkserver" and launch.get("preload"):
        # the server imports these once; every worker it forks skips them (nothing here creates GL/CUDA state)
        multiprocessing.get_context("forkserver").set_forkserver_preload(list(launch["preload"]))
    construction = launch.get("construction", "workers")
    kwargs = [row["kwargs"] for row in rows]
    if construction == "legacy":
        return ParallelEnv(len(rows), [functools.partial(make_env, **kw) for kw in kwargs], mp_start_method=start_method)
    if construction == "homogeneous":
        return ParallelEnv(len(rows), make_env, create_env_kwargs=kwargs, mp_start_method=start_method)
    return ParallelEnv(
        len(rows),
        make_env,
        create_env_kwargs=kwargs,
        metadata_from_workers=launch.get("metadata_from_workers", True),
        use_buffers=launch.get("use_buffers", False),
        mp_start_method=start_method,
    )


def env_factories(plan: dict[str, Any]) -> list[functools.partial]:
    """One picklable env factory per subcollector."""
    return [env_factory(plan, sub["index"], sub["workers"]) for sub in plan["subcollectors"]]


def env_factory(plan: dict[str, Any], index: int, rows: list[dict]) -> functools.partial:
    """The picklable env factory of subcollector ``index`` over ``rows`` (its plan rows, or a restart's)."""
    return functools.partial(subcollector_env, index, rows, plan["start_methods"]["workers"], dict(plan["launch"]))


class LocalEngine:
    """``MultiSyncCollector`` or ``MultiAsyncCollector`` over the plan's subcollectors, on this machine,
    able to restart one of them (:mod:`.respawn`) unless ``restarts`` is False (torchrl's own classes then)."""

    name = "local"
    weight_sync = None  # the spec's policy.weight_sync

    def __init__(self, restarts: bool = True):
        self.capabilities = frozenset({"weight_updates", *(("restarts", "collector_acks") if restarts else ())})

    def check(self, plan: dict[str, Any]) -> None:
        """Nothing to reach."""

    def connect(self, plan: dict[str, Any]) -> None:
        """Nothing to join."""

    def disconnect(self) -> None:
        """Nothing to leave."""

    def start_eval_round(self, collector, number: int) -> None:
        """The env workers read the run directory itself."""

    def build(self, plan: dict[str, Any], **kwargs: Any):
        """The collector; ``kwargs`` hold the policy arguments and the caller's torchrl options.

        torchrl's multi collectors take no start method and use the global one: the caller sets it
        (and restores its own afterwards).
        """
        if "restarts" in self.capabilities:
            from topo.launch.local.respawn import RespawningAsyncCollector as Async, RespawningSyncCollector as Sync
        else:
            from torchrl.collectors import MultiAsyncCollector as Async, MultiSyncCollector as Sync

        cls = Sync if plan["collector"]["sync"] else Async
        return cls(env_factories(plan), frames_per_batch=plan["collector"]["frames_per_batch"],
                   total_frames=plan["collector"]["total_frames"], **kwargs)

    def supervise(self, collector, recovery) -> None:
        """Hand the collector the run's side of restarts (:class:`~topo.launch.supervision.recovery.Recovery`)."""
        collector.recovery = recovery

    def shutdown(self, collector, timeout: float) -> list[int | None]:
        """Close the envs and subcollector processes within ``timeout``; their exit codes (None: unknown)."""
        collector.shutdown(timeout=timeout, raise_on_error=False)
        return [_exit_code(p) for p in getattr(collector, "procs", [])]


def _exit_code(proc) -> int | None:
    try:
        return proc.exitcode
    except ValueError:  # torchrl already shut down and closed it (after a subcollector failed)
        return None
