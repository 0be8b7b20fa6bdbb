"""The torchrl topology of a plan: one outer multi-process collector, one ParallelEnv per subcollector.

Runs in the collector process (:mod:`topo.launch.runner`) and, for :func:`subcollector_env`, inside
each subcollector process. The parent of a ParallelEnv builds no env: workers send their metadata.
"""
from __future__ import annotations

import functools
import multiprocessing
from typing import Any

from .markers import RunDir


def subcollector_env(index: int, rows: list[dict], start_method: str, launch: dict[str, Any]):
    """The env of subcollector ``index``: ``ParallelEnv`` over ``topo.worker.make_env``, one row per worker.

    Module-level so that its ``functools.partial`` over plain data pickles with any start method.
    ``serial_for_single`` stays off: a one-worker subcollector keeps its env in a worker process.
    ``launch["construction"]`` other than ``workers`` rebuilds how people do it today, for
    ``topo bench``: ``homogeneous`` (one factory + kwargs, torchrl's default metadata: one env in this
    process) and ``legacy`` (one distinct callable per worker: every env once more in this process).
    """
    from torchrl.envs import ParallelEnv

    from topo.worker import make_env

    run = RunDir.current()
    if run is not None:
        run.marker("subcollector", index=index, start_method=multiprocessing.get_start_method())
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
    return [
        functools.partial(subcollector_env, sub["index"], sub["workers"], plan["start_methods"]["workers"],
                          dict(plan["launch"]))
        for sub in plan["subcollectors"]
    ]


def make_collector(plan: dict[str, Any]):
    """``MultiSyncCollector`` or ``MultiAsyncCollector`` (random policy) with the plan's start method.

    torchrl's multi collectors take no start method and use the global one, forcing spawn when unset:
    set it here, in the dedicated collector process, before the collector starts its subcollectors.
    """
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

    multiprocessing.set_start_method(plan["start_methods"]["subcollectors"], force=True)
    cls = MultiSyncCollector if plan["collector"]["sync"] else MultiAsyncCollector
    return cls(
        env_factories(plan),
        policy=None,
        frames_per_batch=plan["collector"]["frames_per_batch"],
        total_frames=plan["collector"]["total_frames"],
    )
