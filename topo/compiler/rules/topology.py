"""Rules on the topology's shape and how its processes start."""
from __future__ import annotations

import multiprocessing

from topo.diagnostics import Diagnostic, error, warning
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context

MAX_TOTAL_WORKERS = 1_000_000


def shape(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """One worker count per subcollector, and not more workers than topo plans."""
    out = []
    if spec.workers_listed and len(spec.workers) != spec.subcollectors:
        out.append(error(
            "workers-list-length",
            f"workers_per_subcollector lists {len(spec.workers)} subcollector(s) but subcollectors is {spec.subcollectors}",
            ("topology", "workers_per_subcollector"),
            f"give {spec.subcollectors} numbers, or one number for all",
        ))
    if spec.total_workers > MAX_TOTAL_WORKERS:
        out.append(error(
            "topology-too-large",
            f"{spec.subcollectors} subcollectors x {max(spec.workers)} workers = {spec.total_workers} workers, "
            f"more than {MAX_TOTAL_WORKERS}",
            ("topology",), "split the job across several specs or nodes",
        ))
    return out


def workers_path(spec: Spec, c: int) -> tuple:
    """Where subcollector ``c``'s worker count is written."""
    if spec.workers_listed:
        return ("topology", "workers_per_subcollector", c)
    return ("topology", "workers_per_subcollector")


def start_methods(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Start methods this platform has, and what each choice means for the backend."""
    out = []
    available = multiprocessing.get_all_start_methods()
    for role, method in (("subcollectors", spec.start_subcollectors), ("workers", spec.start_workers)):
        if method not in available:
            out.append(error("start-method-unavailable", f"start method {method!r} is not available on this platform "
                             f"(available: {', '.join(available)})", ("topology", "start_method", role), "use spawn"))
    if ctx.backend is not None and spec.start_workers == "fork" and ctx.backend.uses_gl(spec.env_kwargs):
        out.append(warning("fork-with-rendering", f"env workers of {spec.backend!r} render with GL/EGL; forked, each "
                           "starts as a copy of its subcollector: topo keeps GL out of it, but not the threads, pipes "
                           "or CUDA state that other code there may hold", ("topology", "start_method", "workers"),
                           "forkserver (the default) starts every worker clean from the run's one forkserver; "
                           "measure both on your node: topo bench SPEC --modes forkserver-preload,fork"))
    if spec.wrote("topology", "start_method", "preload") and spec.preload and spec.start_workers != "forkserver":
        out.append(warning("preload-unused", f"preload only applies to forkserver env workers, not {spec.start_workers!r}",
                           ("topology", "start_method", "preload"), "remove preload, or use workers: forkserver"))
    return out
