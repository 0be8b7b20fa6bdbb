"""The one env-worker factory. ``ParallelEnv`` calls ``make_env(**row["kwargs"])`` inside each worker."""
from __future__ import annotations

import functools
import os
import time
import traceback

from topo.runtime import gl, heartbeat, tracked
from topo.runtime.builder import import_builder
from topo.runtime.episodes import RECORD_VAR, RETAIN_VAR
from topo.runtime.rundir import RunDir, eval_round, record_close, restart_number
from topo import seeding


def make_env(*, builder: str, env: dict, seed: int | None = None, render_gpu: int | None = None,
             render_numbering: str | None = None, render_fallback: bool = False,
             worker: dict | None = None, backend: str | None = None, schedule: dict | None = None,
             transforms: list[dict] | None = None):
    """Build one env from a plan row's kwargs: ``builder(env, render_gpu=..., render_numbering=...,
    render_fallback=...)``, then ``set_seed(seed)``, then ``TransformedEnv`` over it with the row's
    ``transforms`` (:func:`topo.runtime.transforms.build_stack`), in the same ``failed``-marked construction.

    ``backend`` names the env family (informational); ``worker`` locates the row in the plan; an eval
    row's ``schedule`` makes it a :class:`~topo.envs.scheduled.ScheduledEnv` running the row's episodes
    with the builder's envs, in the rounds the trainer starts (:func:`topo.runtime.rundir.eval_round`).

    Under ``topo launch`` it also writes ``started``/``constructed``/``failed``/``closed`` markers, stamps
    each env step in the subcollector's beats file (:mod:`topo.runtime.heartbeat`), waits for a start slot
    when ``max_concurrent_starts`` is set, and records the env's episodes (:mod:`topo.envs.recording`:
    every step carries its episode id).

    Under a stack, recording and heartbeats go on the transformed env, the env the policy steps: a recorded step
    is a decision (a chunk's actions ``[N, ...]`` under ``MultiAction``, the stack's reward and done), so that
    ``topo replay`` rebuilds the same stack and re-executes the decisions; the seed state is the base env's (its
    generators decide the episode), and its steps are counted under the stack, each a chunk's env step, for the
    episode's record and the beats file.
    """
    inherited_gl = gl.loaded_libraries()  # before the builder: from a parent (fork, forkserver) or an import
    seeding.seed_globals(seeding.derive([seed], "worker"))  # the global RNGs, before the env is built
    gl.release()
    run = RunDir.current()
    render = {"render_gpu": render_gpu, "render_numbering": render_numbering, "render_fallback": render_fallback}
    base = functools.partial(_build, builder, env, seed, render) if schedule is None else \
        functools.partial(_scheduled, builder, schedule, seed, render, run)
    build = functools.partial(_transformed, base, transforms)
    if run is None:
        return build()[1]
    where = dict(worker or {})
    tracked.keep(run.path)
    with run.start_slot():
        run.marker("started", worker=where, inherited_gl=inherited_gl)
        started = time.monotonic()
        try:
            inner, instance = build()
        except BaseException:
            run.marker("failed", worker=where, traceback=traceback.format_exc())
            raise
        built = time.time()  # in the slot: the marker's time, so that no construction seems to overlap the next start
    run.marker("constructed", worker=where, seed=seed, seconds=time.monotonic() - started, time=built,
               render_device=getattr(inner, "topo_render_device", None),
               model_cache=getattr(inner, "topo_model_cache", None),
               **({"transforms": [t["name"] for t in transforms]} if transforms else {}))
    record = os.environ.get(RECORD_VAR, "episodes")
    if "global_index" in where and record != "off":
        from topo.envs.recording import wrap

        keep = os.environ.get(RETAIN_VAR)
        instance = wrap(instance, run.path, where, seed, restart_number(), record == "actions", int(keep) if keep else None,
                        base=inner)
    record_close(instance, run, where)
    heartbeat.watch(instance, run, where, base=inner)
    return instance


def _transformed(build, transforms: list[dict] | None):
    """(the built env, the env the worker serves: it, or ``TransformedEnv`` over it with ``transforms``)."""
    inner = build()
    if not transforms:
        return inner, inner
    from topo.runtime.transforms import wrap

    try:
        return inner, wrap(inner, transforms)
    except BaseException:
        inner.close()
        raise


def _scheduled(builder: str, schedule: dict, seed: int | None, render: dict, run: RunDir | None):
    from topo.envs.scheduled import ScheduledEnv

    instance = ScheduledEnv(schedule, lambda env: import_builder(builder)(dict(env), **render),
                            (lambda: eval_round(run)) if run is not None else (lambda: 1))
    if seed is not None:
        instance.set_seed(seed)
    return instance


def _build(builder: str, env: dict, seed: int | None, render: dict):
    instance = import_builder(builder)(dict(env), **render)
    if seed is not None:
        instance.set_seed(seed)
    return instance
