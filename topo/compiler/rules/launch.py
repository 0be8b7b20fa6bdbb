"""Rules on the launch and collector sections."""
from __future__ import annotations

import math

from topo.diagnostics import Diagnostic, error, warning
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context


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
    if len(spec.workers) != spec.subcollectors or spec.mode == "async":
        # workers-list-length: the arithmetic would count the wrong subcollectors; async: batches are flat, any size
        return out
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
    """Health budgets need the local engine (the trainer reads each worker's health there); restarts and hang
    detection work on both."""
    engine = spec.placement.engine
    if engine == "local" or spec.recycle is None:
        return []
    return [error("recovery-needs-local-engine", f"launch.recycle works on the local engine: under engine {engine!r} "
                  "the trainer does not read the actors' workers' health (launch.restarts and hang_timeout do work "
                  "there)", ("launch", "recycle"), "remove it, or use placement.engine: local")]


def recycle(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Health budgets a healthy worker stays within: above the backend's memory per worker, a drift above 1."""
    r = spec.recycle
    if r is None:
        return []
    path = ("launch", "recycle")
    if (r.max_rss_gb, r.max_latency_drift, r.max_episodes) == (None, None, None):
        return [warning("recycle-without-budget", "launch.recycle names no budget: nothing is ever recycled", path,
                        "set max_rss_gb, max_latency_drift or max_episodes, or remove the section")]
    out = []
    per_worker = ctx.backend.memory_per_worker_gb if ctx.backend is not None else None
    if r.max_rss_gb is not None and per_worker:
        if r.max_rss_gb <= per_worker:
            out.append(error("recycle-below-worker-memory", f"max_rss_gb {r.max_rss_gb:g} is not above the {spec.backend} "
                             f"backend's ~{per_worker:g} GB per worker: every worker would be recycled at every check",
                             path + ("max_rss_gb",), f"raise it above {per_worker:g} GB, e.g. {1.5 * per_worker:g}"))
        elif r.max_rss_gb < 1.25 * per_worker:
            out.append(warning("recycle-rss-tight", f"max_rss_gb {r.max_rss_gb:g} leaves {r.max_rss_gb - per_worker:.2g} GB "
                               f"over the {spec.backend} backend's ~{per_worker:g} GB per worker "
                               f"({r.max_rss_gb / per_worker:.0%} of it): a worker's ordinary peaks may cross it",
                               path + ("max_rss_gb",), f"use at least {1.25 * per_worker:g} GB (125%)"))
    if r.max_latency_drift is not None and r.max_latency_drift <= 1:
        out.append(error("recycle-drift-not-above-one", f"max_latency_drift {r.max_latency_drift:g} is a ratio of a worker's "
                         "recent mean step duration to its own baseline: at or below 1, a healthy worker crosses it",
                         path + ("max_latency_drift",), "use a ratio above 1, e.g. 1.5 (steps 50% slower than at first)"))
    return out
