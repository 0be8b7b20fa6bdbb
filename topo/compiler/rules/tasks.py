"""Rules on the tasks workers run: ids, ranges, coverage, init states."""
from __future__ import annotations

from collections import Counter

from topo.compiler.assign import task_list
from topo.diagnostics import Diagnostic, error, ids_text, task_order, warning
from topo.compiler.spec import Spec, empty_range
from topo.compiler.rules.blocks import layout
from topo.compiler.rules.context import Context


def tasks(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Task ids that exist, cover the workers, and ranges that name some."""
    catalog, backend = ctx.catalog, ctx.backend
    out = []
    if spec.blocks is not None:
        out += layout(spec, ctx)
        if spec.wrote("assignment", "tasks"):
            out.append(error("tasks-and-blocks", "give either tasks or blocks, not both",
                             ("assignment", "blocks"), "blocks lay out workers explicitly; remove tasks"))
        return out
    ids = task_list(spec, catalog)
    path = ("assignment", "tasks")
    for i, item in enumerate(spec.task_items):
        if (empty := empty_range(item)) is not None:
            lo, hi, fixed = empty
            out.append(error("task-range-empty", f"task range {item!r} is empty ({lo} > {hi})",
                             path + (i,) if spec.tasks_listed else path, f"write it {fixed}"))
    if not spec.wrote("assignment", "tasks") and catalog is not None:
        out.append(error("tasks-missing", f"backend {spec.backend!r} runs one of its {len(catalog.ids)} tasks in each "
                         "worker, but the spec assigns none", ("assignment",),
                         f"add assignment.tasks: all (or ids such as 0-{len(catalog.ids) - 1}), or assignment.blocks"))
    if spec.tasks_all and catalog is None and backend is not None:
        out.append(error("tasks-all-unknown", f"backend {spec.backend!r} has no task catalog, so 'all' means nothing",
                         path, "list the task ids"))
    if spec.tasks is not None:
        dup = sorted((t for t, n in Counter(ids).items() if n > 1), key=task_order)
        if dup:
            out.append(warning("task-duplicate", f"task id(s) {ids_text(dup)} listed more than once: they get more workers",
                               path, "list each task once"))
        if catalog is not None:
            unknown = sorted({t for t in ids if t not in catalog}, key=task_order)
            if unknown:
                exists, hint = catalog.extent(unknown, spec.backend)
                out.append(error("task-unknown", f"task id(s) {ids_text(unknown)} do not exist: {exists}", path, hint))
    for t in spec.instructions:
        if ids and t not in ids:
            out.append(warning("instruction-unused", f"an instruction is given for task {t}, which no worker runs",
                               ("assignment", "instructions", t), f"tasks are {ids_text(ids)}"))
    if not ids:
        return out
    g = spec.groups
    total = spec.total_workers
    units = total // g.size if g.parallel_repeats else total
    unit_name = f"{units} group worker(s) ({total} workers // group size {g.size})" if g.parallel_repeats else f"{total} workers"
    n = len(ids)
    if units < n:
        dropped = ids[units:]
        out.append(error(
            "task-coverage",
            f"{unit_name} cannot cover {n} tasks: tasks {ids_text(dropped)} would get no worker",
            path, f"use at least {n * (g.size if g.parallel_repeats else 1)} workers, or fewer tasks",
        ))
    elif units % n and not (g.parallel_repeats and any(m % g.size for m in spec.workers)):
        # (with groups that do not divide the workers, the group-size error says what to fix first)
        more = units % n
        few = f"task {ids[0]} gets" if more == 1 else f"tasks {ids_text(ids[:more])} get"
        out.append(warning(
            "task-coverage-uneven",
            f"{unit_name} over {n} tasks is uneven ({units} % {n} = {more}): {few} "
            f"{units // n + 1}, the others {units // n}",
            path, f"use a multiple of {n * (g.size if g.parallel_repeats else 1)} workers for even coverage",
        ))
    return out


def init_states(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """The init state id exists for every task that runs."""
    catalog = ctx.catalog
    if catalog is None or not catalog.init_states:
        return []
    ids = [b.task for b in spec.blocks] if spec.blocks else task_list(spec, catalog)
    short = sorted({t for t in ids if t in catalog.init_states and spec.init_state_id >= catalog.init_states[t]},
                   key=task_order)
    if not short:
        return []
    counts = sorted({catalog.init_states[t] for t in short})
    return [error("init-state-unknown", f"init state id {spec.init_state_id} does not exist for task(s) {ids_text(short)} "
                  f"({'/'.join(map(str, counts))} init states, ids 0-{counts[0] - 1})",
                  ("assignment", "init_states", "id"), f"use an id below {counts[0]}")]
