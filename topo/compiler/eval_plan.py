"""The eval section of a plan: which episodes one evaluation runs, their seeds, and how they split over eval workers.

Pure and deterministic, like :mod:`topo.compiler.assign`. One evaluation runs every (task, init state) exactly
``trials`` times. Its episodes are ordered (task in ``eval.tasks`` order, init state ascending, trial
ascending), numbered 0..E-1, and split contiguously over the W eval workers in global order: the first
``E % W`` workers get ``E // W + 1`` episodes, the others ``E // W``; no worker count has to divide anything.

Seeds (one per episode, in episode order): ``offset``: ``base + e``; ``sequence``: the ``(N + e)``-th child of
``numpy.random.SeedSequence(base)``, N the training worker count (with the training's base, the children
after the training ones). Without ``eval.seeds``, the stream starts after training's (:func:`seed_stream`).

A backend without tasks has one task, ``None``; a backend without init states one init state per task,
``None``. The builder input of each task of a row is ``backend.env_kwargs`` of an :class:`Assignment` without
GRPO groups and with ``init_state_mode: fixed`` (the row's first init state of that task), keyed in the
row's schedule by the task id as JSON text (``"2"``, ``"null"``).
"""
from __future__ import annotations

import copy
import json
from typing import Any, Iterator

from topo.compiler.assign import seeds as training_seeds
from topo.compiler.assign import task_list
from topo.backends.base import Assignment, Backend, TaskCatalog
from topo.compiler.limits import MAX_EVAL_EPISODES
from topo.compiler.row import EvalRow, kwargs_block
from topo.compiler.spec import Eval, Spec

ROLE = "eval"

__all__ = ["MAX_EVAL_EPISODES", "ROLE", "count", "default_workers", "episodes", "eval_tasks", "init_states_of",
           "plan_section", "seed_stream", "seeds", "split", "training_task_ids", "env_key"]


def training_task_ids(spec: Spec, catalog: TaskCatalog | None) -> tuple[int, ...]:
    """The tasks training workers run, each once, in order (a block layout's tasks, or assignment.tasks)."""
    if spec.blocks is not None:
        return tuple(dict.fromkeys(b.task for b in spec.blocks))
    return tuple(dict.fromkeys(task_list(spec, catalog)))


def eval_tasks(spec: Spec, catalog: TaskCatalog | None) -> tuple[int | None, ...]:
    """The eval tasks in order; ``(None,)`` when there are none to name (a backend without tasks)."""
    e = spec.eval
    if e is not None and e.tasks_all:
        ids: tuple = catalog.ids if catalog is not None else ()
    elif e is not None and e.tasks is not None:
        ids = e.tasks
    else:
        ids = training_task_ids(spec, catalog)
    return tuple(ids) or (None,)


def init_states_of(e: Eval, task: int | None, catalog: TaskCatalog | None) -> list[int | None]:
    """The init states ``task`` runs, ascending; ``[None]`` without init states."""
    if task is None or catalog is None or not catalog.init_states:
        return [None]
    if e.init_states is None:
        return list(range(catalog.init_states.get(task, 0))) or [None]
    return sorted(set(e.init_states))


def count(spec: Spec, catalog: TaskCatalog | None) -> tuple[int, list[tuple[int | None, int]]]:
    """Episodes of one evaluation, by arithmetic (nothing listed): the total, and (task, init states) per task."""
    e = spec.eval
    assert e is not None
    listed = len(set(e.init_states)) if e.init_states is not None else 0
    per_task = []
    for task in eval_tasks(spec, catalog):
        if task is None or catalog is None or not catalog.init_states:
            n = 1
        elif e.init_states is None:
            n = catalog.init_states.get(task, 0) or 1
        else:
            n = listed
        per_task.append((task, n))
    return sum(n for _, n in per_task) * e.trials, per_task


def default_workers(spec: Spec, catalog: TaskCatalog | None, episodes: int) -> tuple[int, ...]:
    """Without eval.workers: one subcollector, one worker per eval task, never more than the episodes."""
    return (max(1, min(len(eval_tasks(spec, catalog)), episodes)),)


def workers_of(spec: Spec, catalog: TaskCatalog | None, episodes: int) -> tuple[int, ...]:
    e = spec.eval
    assert e is not None
    return e.workers if e.workers is not None else default_workers(spec, catalog, episodes)


def episodes(spec: Spec, catalog: TaskCatalog | None) -> Iterator[tuple[int | None, int | None, int]]:
    """(task, init state, trial) of every episode, in episode order. Count first (:func:`count`): this lists."""
    e = spec.eval
    assert e is not None
    for task in eval_tasks(spec, catalog):
        for state in init_states_of(e, task, catalog):
            for trial in range(e.trials):
                yield task, state, trial


def seed_stream(spec: Spec) -> tuple[str, int]:
    """(strategy, base) of the eval seeds: as written, else the stream that starts after training's.

    offset: the training base + N (N training workers: the seeds after the training ones); sequence: the
    training base, whose children 0..N-1 training uses (eval takes N, N+1, ...); after a training seeds.list,
    offset from its largest seed + 1.
    """
    e = spec.eval
    assert e is not None
    listed = spec.seed_list is not None
    strategy = e.seed_strategy or ("offset" if listed else spec.seed_strategy)
    if e.seed_base is not None:
        return strategy, e.seed_base
    if strategy == "sequence":
        return strategy, spec.seed_base
    if listed:
        return strategy, max(spec.seed_list or (-1,)) + 1
    return strategy, spec.seed_base + spec.total_workers


def seeds(spec: Spec, n: int) -> list[int]:
    """The seeds of episodes 0..n-1."""
    strategy, base = seed_stream(spec)
    if strategy == "sequence":
        import numpy as np

        first = spec.total_workers
        return [int(np.random.SeedSequence(base, spawn_key=(first + e,)).generate_state(1, np.uint64)[0]) >> 1
                for e in range(n)]
    return [base + e for e in range(n)]


def train_seeds(spec: Spec) -> list[int]:
    """Every training worker's seed, in global order."""
    return training_seeds(spec)


def split(total: int, workers: int) -> list[int]:
    """Episodes per worker: contiguous, the first ``total % workers`` get one more."""
    q, r = divmod(total, workers)
    return [q + 1 if g < r else q for g in range(workers)]


def env_key(task: int | None) -> str:
    """A task's key in a row's ``schedule.envs``: its id as JSON text (``"2"``; ``"null"`` without tasks)."""
    return json.dumps(task)


def plan_section(spec: Spec, backend: Backend, catalog: TaskCatalog | None,
                 options: dict[str, Any]) -> dict[str, Any] | None:
    """``plan["eval"]`` of a spec that validated without errors; None without an eval section."""
    e = spec.eval
    if e is None:
        return None
    total, per_task = count(spec, catalog)
    tasks = [task for task, _ in per_task]
    trained = set(training_task_ids(spec, catalog))
    held_out = [t for t in tasks if t is not None and t not in trained]
    instruction = {t: _instruction(spec, backend, catalog, t) for t in tasks}
    seed_of = seeds(spec, total)
    listed = [{"episode": i, "task_id": task, "instruction": instruction[task], "init_state_id": state,
               "trial": trial, "seed": seed_of[i]}
              for i, (task, state, trial) in enumerate(episodes(spec, catalog))]
    sizes = workers_of(spec, catalog, total)
    share = split(total, sum(sizes))
    numbering = e.render_numbering if e.render_gpus else None
    fallback = e.render_fallback and numbering == "egl"
    carried = spec.transform_stack(row=True)
    subcollectors, per_worker = [], []
    g = start = 0
    for c, count_c in enumerate(sizes):
        gpu = e.render_gpus[c % len(e.render_gpus)] if e.render_gpus else None
        rows = []
        for w in range(count_c):
            mine = listed[start:start + share[g]]
            start += share[g]
            row_tasks = list(dict.fromkeys(ep["task_id"] for ep in mine))
            envs = {}
            for task in row_tasks:
                first = next(ep for ep in mine if ep["task_id"] == task)
                envs[env_key(task)] = _builder_input(spec, backend, options, c, w, g, first, gpu)
            worker = {"subcollector": c, "index": w, "global_index": g}
            block = kwargs_block(backend=spec.backend, builder=backend.builder,
                                 env=copy.deepcopy(envs[env_key(mine[0]["task_id"])]), seed=mine[0]["seed"],
                                 render_gpu=gpu, render_numbering=numbering, render_fallback=fallback,
                                 worker={**worker, "role": ROLE},
                                 schedule={"envs": envs, "episodes": [dict(ep) for ep in mine],
                                           "max_episode_steps": e.max_episode_steps}, transforms=carried)
            row: EvalRow = {**worker, "role": ROLE, "tasks": row_tasks, "episodes": [dict(ep) for ep in mine],
                            "render_gpu": gpu, "render_numbering": numbering, "kwargs": block}
            rows.append(row)
            per_worker.append({**worker, "episodes": len(mine), "tasks": row_tasks})
            g += 1
        subcollectors.append({"index": c, "num_workers": count_c, "render_gpu": gpu, "workers": rows})
    strategy, base = seed_stream(spec)
    return {
        "tasks": tasks,
        "held_out": held_out,
        "init_states": "all" if e.init_states is None else sorted(set(e.init_states)),
        "trials": e.trials,
        "episodes": total,
        "max_episode_steps": e.max_episode_steps,
        "every": e.every,
        "async": e.run_async,
        "busy_policy": e.busy_policy,
        "exploration": e.exploration,
        "policy": e.policy,
        "seeds": {"strategy": strategy, "base": base},
        "subcollectors": subcollectors,
        "coverage": {
            "episodes": total,
            "workers": sum(sizes),
            "tasks": [{"task_id": task, "instruction": instruction[task], "episodes": n * e.trials,
                       "init_states": None if init_states_of(e, task, catalog) == [None] else n,
                       "held_out": task in held_out}
                      for task, n in per_task],
            "per_worker": per_worker,
        },
    }


def _instruction(spec: Spec, backend: Backend, catalog: TaskCatalog | None, task: int | None) -> str | None:
    text = spec.instructions.get(task) if task is not None else None
    return text if text is not None else backend.default_instruction(task, catalog)


def _builder_input(spec: Spec, backend: Backend, options: dict[str, Any], c: int, w: int, g: int,
                   first: dict[str, Any], gpu: int | None) -> dict[str, Any]:
    """What the builder gets for one task of a row: the training's kwargs for it, without GRPO groups, with the
    row's first init state of that task fixed, and the eval horizon where the backend's kwargs have one."""
    state = first["init_state_id"]
    a = Assignment(c, w, g, first["task_id"], first["instruction"], 0, None, "episode", first["seed"], "fixed",
                   0 if state is None else state, gpu, {})
    env = backend.env_kwargs(spec.env_kwargs, a)
    horizon = spec.eval.max_episode_steps if spec.eval is not None else None
    if horizon is not None and backend.horizon_key:
        env[backend.horizon_key] = horizon
    if options:
        env["options"] = dict(options)
    return env
