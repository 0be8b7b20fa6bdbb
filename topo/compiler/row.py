"""A plan's worker row, declared once: its fields (:class:`Row`, :class:`EvalRow`), its kwargs block (:class:`Kwargs`:
exactly the ``create_env_kwargs`` entry the worker gets, the keywords of :func:`topo.worker.make_env`) and the
functions that make them (:func:`kwargs_block`, :func:`training_row`), which the plan and the eval plan share.

A plan stays plain JSON data (``docs/reference/plan-format.md``): these are typed dicts, for a reader and a type
checker; nothing here checks a saved plan (:mod:`topo.compiler.planfile` does).
"""
from __future__ import annotations

import copy
from typing import Any, TypedDict

from topo.backends.base import Assignment
from topo.compiler.assign import GROUP_ID_OFFSET

__all__ = ["EvalRow", "Kwargs", "Row", "Where", "kwargs_block", "training_row"]


class _WhereRequired(TypedDict):
    subcollector: int
    index: int
    global_index: int


class Where(_WhereRequired, total=False):
    """Where a row sits: the ``worker`` its records are filed under (an eval row adds ``role: eval``)."""

    role: str


class _KwargsRequired(TypedDict):
    backend: str
    builder: str
    env: dict[str, Any]
    seed: int | None
    render_gpu: int | None
    render_numbering: str | None
    render_fallback: bool
    worker: Where


class Kwargs(_KwargsRequired, total=False):
    """A row's kwargs block: the worker's ``create_env_kwargs`` entry, passed to :func:`topo.worker.make_env` as is.
    ``schedule`` (eval rows only): the episodes the row runs and the builder input of each of its tasks;
    ``transforms`` (``env.transforms_at: worker`` only): the stack the worker wraps its env in."""

    schedule: dict[str, Any]
    transforms: list[dict[str, Any]]


class _RowRequired(TypedDict):
    subcollector: int
    index: int
    global_index: int
    task_id: int | None
    instruction: str | None
    group: int
    group_id_offset: int
    group_repeats: int | None
    group_id_mode: str
    seed: int | None
    init_state_mode: str
    init_state_id: int
    render_gpu: int | None
    kwargs: Kwargs


class Row(_RowRequired, total=False):
    """One training worker's row of a plan: a plain dict, typed for a type checker. ``kwargs`` is exactly the
    ``create_env_kwargs`` entry the worker gets. ``render_numbering`` is absent from plans an older topo wrote."""

    render_numbering: str | None


class EvalRow(TypedDict):
    """One eval worker's row (the plan's ``eval`` section): the tasks and episodes it runs, in order."""

    subcollector: int
    index: int
    global_index: int
    role: str
    tasks: list[int | None]
    episodes: list[dict[str, Any]]
    render_gpu: int | None
    render_numbering: str | None
    kwargs: Kwargs


def kwargs_block(*, backend: str, builder: str, env: dict[str, Any], seed: int | None, render_gpu: int | None,
                 render_numbering: str | None, render_fallback: bool, worker: Where,
                 schedule: dict[str, Any] | None = None, transforms: list[dict[str, Any]] | None = None) -> Kwargs:
    """A row's kwargs block, in the order a saved plan shows it (``transforms``: a copy of it, when given)."""
    block: Kwargs = {"backend": backend, "builder": builder, "env": env, "seed": seed, "render_gpu": render_gpu,
                     "render_numbering": render_numbering, "render_fallback": render_fallback, "worker": worker}
    if schedule is not None:
        block["schedule"] = schedule
    if transforms:
        block["transforms"] = copy.deepcopy(transforms)
    return block


def training_row(a: Assignment, render_numbering: str | None, kwargs: Kwargs) -> Row:
    """The row of training worker ``a`` (its group: the block ``a.group_id_offset`` falls in)."""
    return {
        "subcollector": a.subcollector, "index": a.index, "global_index": a.global_index,
        "task_id": a.task_id, "instruction": a.instruction,
        "group": a.group_id_offset // GROUP_ID_OFFSET, "group_id_offset": a.group_id_offset,
        "group_repeats": a.group_repeats, "group_id_mode": a.group_id_mode,
        "seed": a.seed, "init_state_mode": a.init_state_mode, "init_state_id": a.init_state_id,
        "render_gpu": a.render_gpu, "render_numbering": render_numbering, "kwargs": kwargs,
    }
