"""What every engine builds a subcollector from: one worker-metadata ``ParallelEnv`` over its plan rows.

:func:`env_factory` is made in the trainer (plain data, picklable with any start method) and called where the
subcollector runs: a local subcollector process or a Ray actor. The parent of a ParallelEnv builds no env:
workers send their metadata.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
from typing import Any

from topo.runtime import heartbeat, tracked
from topo.runtime.rundir import RunDir
from topo import seeding
from topo.launch import boundary, forkserver as forkserver_, observe
from topo.compiler.row import Row


def subcollector_env(index: int, rows: list[Row], start_method: str, launch: dict[str, Any],
                     transforms: list[dict] | None = None, forkserver: str | None = None):
    """The env of subcollector ``index``: ``ParallelEnv`` over ``topo.worker.make_env``, one row per worker;
    ``transforms`` (``env.transforms_at: subcollector``): ``TransformedEnv`` over it with that stack, built here
    (a ``transforms`` marker; each of its steps counts its workers' decisions: :func:`topo.runtime.heartbeat.decisions`).

    Module-level so that its ``functools.partial`` over plain data pickles with any start method.
    ``serial_for_single`` stays off: a one-worker subcollector keeps its env in a worker process.
    The subcollector leads a process group of its own (its env workers join it), so a Ctrl-C in the
    trainer's terminal reaches the trainer only, which then shuts everything down in order. ``forkserver``: the
    address of the run's forkserver (:mod:`topo.launch.forkserver`), which this subcollector was forked from and
    forks its env workers from.
    ``launch["construction"]`` other than ``workers`` rebuilds how people do it today, for ``topo bench``
    (documented in docs/reference/plan-format.md): ``homogeneous`` (one factory + kwargs, torchrl's default
    metadata: one env in this process) and ``legacy`` (one distinct callable per worker: every env once
    more in this process).
    """
    from torchrl.envs import ParallelEnv

    from topo.worker import make_env

    observe.set_subcollector(index, rows[0]["kwargs"].get("backend") if rows else None)
    seeding.seed_globals(seeding.derive([row["seed"] for row in rows], "subcollector"))  # where its policy samples
    run = RunDir.current()
    if run is not None:
        if os.getpid() != os.getpgid(0):
            os.setpgid(0, 0)
        tracked.keep(run.path)
        run.marker("subcollector", index=index, start_method=multiprocessing.get_start_method())
        heartbeat.open_subcollector(run, index, len(rows))
    requester = None
    if start_method == "forkserver" and forkserver is not None:  # its workers take this process's environment, group
        requester = forkserver_.Requester(dict(os.environ), os.getpgid(0))
    wrapped = (run is not None or requester is not None) and boundary.quiet_env_workers(requester)
    if requester is not None and wrapped:
        forkserver_.adopt(forkserver)
    elif start_method == "forkserver" and launch.get("preload"):
        # the server imports these once; every worker it forks skips them (nothing here creates GL/CUDA state)
        multiprocessing.get_context("forkserver").set_forkserver_preload(list(launch["preload"]))
    construction = launch.get("construction", "workers")
    kwargs = [row["kwargs"] for row in rows]
    if construction == "legacy":
        env = ParallelEnv(len(rows), [functools.partial(make_env, **kw) for kw in kwargs], mp_start_method=start_method)
    elif construction == "homogeneous":
        env = ParallelEnv(len(rows), make_env, create_env_kwargs=kwargs, mp_start_method=start_method)
    else:
        env = ParallelEnv(
            len(rows),
            make_env,
            create_env_kwargs=kwargs,
            metadata_from_workers=launch.get("metadata_from_workers", True),
            use_buffers=launch.get("use_buffers", False),
            mp_start_method=start_method,
        )
    return env if not transforms else _transformed(env, transforms, index, run)


def _transformed(env, transforms: list[dict], index: int, run: RunDir | None):
    """``env`` under the stack; a stack that raises closes ``env`` (its workers) and fails this subcollector."""
    from topo.runtime.transforms import wrap

    try:
        out = wrap(env, transforms)
    except BaseException:
        env.close(raise_if_closed=False)
        raise
    if run is not None:
        run.marker("transforms", index=index, names=[t["name"] for t in transforms])
    heartbeat.decisions(out)
    return out


def env_factories(plan: dict[str, Any], forkserver: str | None = None) -> list[functools.partial]:
    """One picklable env factory per subcollector."""
    return [env_factory(plan, sub["index"], sub["workers"], forkserver) for sub in plan["subcollectors"]]


def env_factory(plan: dict[str, Any], index: int, rows: list[Row], forkserver: str | None = None) -> functools.partial:
    """The picklable env factory of subcollector ``index`` over ``rows`` (its plan rows, or a restart's);
    ``forkserver``: the address of the run's forkserver, where its env workers start."""
    env = plan["env"]
    transforms = env.get("transforms") if env.get("transforms_at") == "subcollector" else None
    return functools.partial(subcollector_env, index, rows, plan["start_methods"]["workers"], dict(plan["launch"]),
                             transforms, forkserver)
