"""Rules on the launch and collector sections."""
from __future__ import annotations

import math

from ..diagnostics import Diagnostic, error, warning
from ..spec import Spec
from .context import Context


def launch(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Launch options that torchrl can honour, and batches that split over subcollectors and workers."""
    out = []
    path = ("launch",)
    if spec.use_buffers and spec.metadata_from_workers:
        out.append(error("use-buffers-with-worker-metadata", "use_buffers: true needs the specs before workers start, "
                         "but metadata_from_workers reads them from the started workers; torchrl cannot do both",
                         path + ("use_buffers",), "remove use_buffers (worker metadata is what keeps envs out of parents)"))
    if not spec.metadata_from_workers:
        out.append(warning("parent-env-construction", f"metadata_from_workers: false makes each of the {spec.subcollectors} "
                           "subcollector(s) build one throwaway env in its own process to read specs",
                           path + ("metadata_from_workers",), "leave it true unless you are benchmarking"))
    if spec.record_actions and not spec.provenance:
        out.append(error("record-actions-without-provenance", "record_actions: true keeps each episode's actions "
                         "under its episode record, but provenance: false records no episode",
                         path + ("record_actions",), "remove provenance: false, or record_actions"))
    k = spec.max_concurrent_starts
    if k is not None and k >= spec.total_workers:
        out.append(warning("max-concurrent-starts-unused", f"max_concurrent_starts {k} >= {spec.total_workers} workers: "
                           "it never limits anything", path + ("max_concurrent_starts",), "lower it or remove it"))
    if len(spec.workers) != spec.subcollectors:
        return out  # workers-list-length: the batch arithmetic would count the wrong subcollectors
    fpb_path = ("collector", "frames_per_batch")
    per_sub = spec.frames_per_batch
    if spec.sync:
        if spec.frames_per_batch % spec.subcollectors:
            out.append(error("frames-per-batch-split", f"frames_per_batch {spec.frames_per_batch} does not split over "
                             f"{spec.subcollectors} subcollectors ({spec.frames_per_batch} % {spec.subcollectors} = "
                             f"{spec.frames_per_batch % spec.subcollectors})", fpb_path, _frames_hint(spec)))
            return out
        per_sub = spec.frames_per_batch // spec.subcollectors
    for m in sorted(set(spec.workers)):
        if per_sub % m:
            what = f"{spec.frames_per_batch} / {spec.subcollectors} = {per_sub}" if spec.sync else str(per_sub)
            out.append(error("frames-per-batch-split", f"each subcollector collects {what} frames per batch, not a "
                             f"multiple of its {m} workers ({per_sub} % {m} = {per_sub % m})", fpb_path,
                             "a subcollector batch of F frames over M workers is [M, F/M]; " + _frames_hint(spec)))
    return out


def _frames_hint(spec: Spec) -> str:
    """The frames_per_batch values nearest the spec's that split evenly: every worker collects alike."""
    workers = math.lcm(*set(spec.workers))
    unit = workers * spec.subcollectors if spec.sync else workers
    why = f"{spec.subcollectors} subcollectors x {workers} workers" if spec.sync else f"{workers} workers"
    below, above = spec.frames_per_batch // unit * unit, (spec.frames_per_batch // unit + 1) * unit
    near = f"{below} or {above}" if below else str(above)
    return f"use {near} (a multiple of {unit} = {why})" if unit > 1 else f"use {near}"


def recovery(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Restarts and hang detection need the local engine (topo restarts and watches local processes only)."""
    engine = spec.placement.engine
    asked = [key for key, on in (("restarts", spec.restarts_max > 0), ("hang_timeout", spec.hang_timeout is not None))
             if on]
    if engine == "local" or not asked:
        return []
    return [error("recovery-needs-local-engine", f"launch.{asked[0]} works on the local engine: under engine {engine!r} "
                  "the subcollectors are actors that topo neither restarts nor watches step by step",
                  ("launch", asked[0]), "remove it, or use placement.engine: local")]
