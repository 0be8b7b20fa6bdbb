"""Compile a validated spec into a plan: one row per worker with its exact create_env_kwargs.

Pure and deterministic; imports neither torch nor a simulator. The plan is plain JSON data
(``docs/reference/plan-format.md``); :func:`dumps` gives its canonical bytes, sealed with its digest.
"""
from __future__ import annotations

import dataclasses
import gc
import json
from typing import Any, Callable, Mapping

from topo.compiler import eval_plan, placement
from topo.compiler.assign import assign
from topo.compiler.coverage import coverage
from topo.errors import SpecError
from topo.compiler.load import Source, load
from topo.compiler.planfile import FORMAT, seal
from topo.compiler.row import Where, kwargs_block, training_row
from topo.compiler.validate import Checked, validate
from topo.version import __version__

__all__ = ["FORMAT", "compile_checked", "dumps", "preload_modules", "rows", "write"]


def compile_source(source: Source, *, strict: bool = False, on_warnings: Callable[[list], Any] | None = None) -> dict:
    """The plan of a loaded spec. Raises :class:`SpecError` on errors (or warnings, when strict);
    ``on_warnings`` receives the warnings of a spec that compiles."""
    checked = validate(source)
    if checked.errors or (strict and checked.warnings):
        raise SpecError(checked.diagnostics)
    if checked.warnings and on_warnings is not None:
        on_warnings(checked.warnings)
    return compile_checked(source, checked)


def compile_spec(path, variables: Mapping[str, str] | None = None, *, strict: bool = False) -> dict:
    """Load, validate and compile the spec at ``path`` into a plan dict."""
    return compile_source(load(path, variables), strict=strict)


def compile_checked(source: Source, checked: Checked) -> dict[str, Any]:
    """The plan of a spec that validated without errors."""
    # a plan is ~5 fresh dicts per worker and no cycles: the cyclic GC would only rescan them
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _compile(source, checked)
    finally:
        if enabled:
            gc.enable()


def _compile(source: Source, checked: Checked) -> dict[str, Any]:
    if checked.errors or checked.spec is None or checked.backend is None:
        raise SpecError(checked.diagnostics)
    spec, backend, catalog = checked.spec, checked.backend, checked.catalog
    shared = spec.env_kwargs
    numbering = spec.render_numbering if spec.render_gpus else None
    fallback = spec.render_fallback and numbering == "egl"
    options = backend.resolve_options(spec.env_options)
    stack, carried = spec.transform_stack(), spec.transform_stack(row=True)
    subcollectors = []
    for c, rows in enumerate(assign(spec, backend, catalog)):
        workers = []
        for a in rows:
            where: Where = {"subcollector": a.subcollector, "index": a.index, "global_index": a.global_index}
            block = kwargs_block(backend=spec.backend, builder=backend.builder,
                                 env=_with_options(backend.env_kwargs(shared, a), options), seed=a.seed,
                                 render_gpu=a.render_gpu, render_numbering=numbering, render_fallback=fallback,
                                 worker=where, transforms=carried)
            workers.append(training_row(a, numbering, block))
        gpu = spec.render_gpus[c % len(spec.render_gpus)] if spec.render_gpus else None
        subcollectors.append({"index": c, "num_workers": len(workers), "render_gpu": gpu, "workers": workers})
    plan = {
        "format": FORMAT,
        "topo_version": __version__,
        "name": spec.name,
        "spec": {"path": source.file, "sha256": source.sha256, "variables": dict(sorted(source.variables.items()))},
        "env": {"backend": spec.backend, "builder": backend.builder, "kwargs": shared, **_with_options({}, options),
                **({"transforms": stack, "transforms_at": spec.transforms_at} if stack else {})},
        "start_methods": {"subcollectors": spec.start_subcollectors, "workers": spec.start_workers},
        "collector": {"sync": spec.sync, "frames_per_batch": spec.frames_per_batch, "total_frames": spec.total_frames,
                      **({"mode": spec.mode} if spec.mode != "multi" else {})},  # absent: multi (plans stay as they were)
        "launch": {
            "startup_timeout": spec.startup_timeout,
            "shutdown_timeout": spec.shutdown_timeout,
            "max_concurrent_starts": spec.max_concurrent_starts,
            "restarts": {"max": spec.restarts_max, "window": spec.restarts_window},
            "hang_timeout": spec.hang_timeout,
            **({"stall_timeout": spec.stall_timeout, "on_stall": spec.on_stall} if spec.stall_timeout else {}),
            "recycle": dataclasses.asdict(spec.recycle) if spec.recycle else None,
            "metadata_from_workers": spec.metadata_from_workers,
            "use_buffers": spec.use_buffers,
            "preload": preload_modules(backend.builder) if spec.start_workers == "forkserver" and spec.preload else None,
            **({"provenance": False} if not spec.provenance else {}),
            **({"record_actions": True} if spec.record_actions else {}),
            **({"retain_episodes": spec.retain_episodes} if spec.retain_episodes else {}),
        },
        "groups": {
            "size": spec.groups.size, "candidate_size": spec.groups.candidate_size,
            "parallel_repeats": spec.groups.parallel_repeats,
        } if spec.groups.declared else None,
        "render": {"numbering": numbering, "device_zero_fallback": fallback} if numbering else None,
        "seeds": {"strategy": "list" if spec.seed_list is not None else spec.seed_strategy, "base": spec.seed_base},
        "placement": placement.plan_section(spec),
        "policy": None if spec.policy is None else {
            "factory": spec.policy.factory, "kwargs": dict(spec.policy.kwargs), "placement": spec.policy.placement,
            "device": spec.policy.device, "weight_sync": spec.policy.weight_sync},
        "subcollectors": subcollectors,
    }
    plan["coverage"] = coverage(plan)
    plan["eval"] = eval_plan.plan_section(spec, backend, catalog, options)
    return plan


def _with_options(env: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A row's builder input: the backend's builder options ride in it as ``options`` (when it has any)."""
    if options:
        env["options"] = dict(options)
    return env


def preload_modules(builder: str) -> list[str]:
    """What a forkserver imports once for its env workers; with GL held (:mod:`topo.runtime.gl`), none of it opens a
    GL display or a CUDA context on import."""
    return ["torch", "torchrl.envs", "topo.worker", builder.partition(":")[0]]


def engine(plan: dict[str, Any]) -> str:
    """Where a plan's subcollectors run: ``local`` processes, or ``ray`` actors."""
    return (plan.get("placement") or {}).get("engine", "local")


def subcollector(plan: dict[str, Any], index: int) -> dict[str, Any]:
    """Subcollector ``index`` of ``plan`` (by its ``index``: a node's plan under async mode on Ray holds some only)."""
    subs = plan["subcollectors"]
    if 0 <= index < len(subs) and subs[index]["index"] == index:
        return subs[index]
    return next(sub for sub in subs if sub["index"] == index)


def rows(plan: dict[str, Any]):
    """Every worker row of a plan, in global order."""
    for sub in plan["subcollectors"]:
        yield from sub["workers"]


def dumps(plan: dict[str, Any]) -> str:
    """Canonical JSON with the plan's digest (:func:`topo.compiler.planfile.seal`): the same plan gives the same bytes."""
    return json.dumps(seal(plan), indent=1, sort_keys=False, ensure_ascii=False) + "\n"


def write(plan: dict[str, Any], path: str) -> None:
    """Save ``plan`` at ``path`` as :func:`dumps` gives it: what ``topo plan -o`` writes and ``topo launch`` reads."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(dumps(plan))
