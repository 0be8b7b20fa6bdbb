"""Rules on assignment.blocks: an explicit layout of workers, each block with its task and kwargs."""
from __future__ import annotations

from typing import Any

from topo.backends import Assignment
from topo.diagnostics import Diagnostic, error, ids_text
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context


def layout(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Blocks that keep the catalog, add up to the topology, name tasks that exist and keep groups whole."""
    catalog, backend = ctx.catalog, ctx.backend
    out = []
    for i, b in enumerate(spec.blocks):
        for key in sorted(set(b.kwargs) & (backend.catalog_keys if backend else frozenset())):
            out.append(error("block-changes-catalog", f"block {i} sets {key}, but its task ids and instructions are "
                             f"resolved against env.kwargs.{key}", ("assignment", "blocks", i, "kwargs", key),
                             f"qualify the block's task by its suite instead, e.g. task: 'libero_object:3'"
                             if key == backend.suite_key else f"use one {key} per spec"))
    total = sum(b.workers for b in spec.blocks)
    path = ("assignment", "blocks")
    if total != spec.total_workers:
        sizes = " + ".join(str(b.workers) for b in spec.blocks)
        out.append(error("blocks-total", f"blocks lay out {sizes} = {total} workers but the topology has "
                         f"{spec.total_workers} ({' + '.join(map(str, spec.workers))})", path,
                         "make the block worker counts add up to the topology"))
    start = 0
    g = spec.groups
    for i, b in enumerate(spec.blocks):
        if catalog is not None and b.task is not None and b.task not in catalog:
            exists, hint = catalog.extent([b.task], spec.backend)
            out.append(error("task-unknown", f"task {b.task} does not exist: {exists}", path + (i, "task"), hint))
        if g.parallel_repeats and b.workers % g.size:
            out.append(error("blocks-split-group", f"block {i} covers workers {start}-{start + b.workers - 1}, which splits "
                             f"a group of {g.size} ({b.workers} % {g.size} = {b.workers % g.size})",
                             path + (i, "workers"), f"give each block a multiple of {g.size} workers"))
        start += b.workers
    return out


def schema_kwargs(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Worker metadata needs one tensor schema per subcollector: blocks may not change schema kwargs in one."""
    backend = ctx.backend
    if backend is None or not spec.blocks:
        return []
    out = []
    start = 0
    spans = []
    for i, b in enumerate(spec.blocks):
        spans.append((start, start + b.workers, i, b))
        start += b.workers
    for c, (first, count) in enumerate(zip(spec.offsets, spec.workers)):
        values: dict[str, dict[Any, list[int]]] = {}
        for lo, hi, i, b in spans:
            if hi <= first or lo >= first + count:
                continue
            effective = backend.env_kwargs(spec.env_kwargs, Assignment(
                c, 0, lo, b.task, None, 0, None, "episode", None, "random", 0, None, b.kwargs))
            for key in backend.schema_keys:
                value = effective.get(key, b.kwargs.get(key, spec.env_kwargs.get(key)))
                values.setdefault(key, {}).setdefault(repr(value), []).append(i)
        for key, by_value in sorted(values.items()):
            if len(by_value) > 1:
                parts = "; ".join(f"{v} in block(s) {ids_text(ix)}" for v, ix in by_value.items())
                members = [i for ix in by_value.values() for i in ix]
                first_block = min((i for i in members if key in spec.blocks[i].kwargs), default=min(members))
                out.append(error("schema-kwargs-differ", f"subcollector {c} mixes {key}: {parts}. Worker metadata needs "
                                 "one tensor schema per subcollector", ("assignment", "blocks", first_block, "kwargs", key),
                                 f"give every worker of subcollector {c} the same {key}, or align blocks with subcollectors"))
    return out
