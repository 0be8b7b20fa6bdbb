"""What ``topo launch`` runs: a spec compiled now, or a saved plan that must still match its spec.

Like ``terraform apply``, a saved plan is refused when it was written by an incompatible topo or
when its spec changed since (same variables, different sha256 of the rendered text).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Mapping

from ..errors import StalePlanError, UsageError

SHUTDOWN_BASE_S = 10.0
SHUTDOWN_PER_WORKER_S = 5.0  # a ParallelEnv in worker-metadata mode closes its workers one at a time


def read_plan(path: str) -> dict | None:
    """The plan saved at ``path``, or None when the file is not a plan (then it is a spec)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError):
        return None
    if isinstance(data, dict) and str(data.get("format", "")).startswith("topo.plan/"):
        return data
    return None


def check_fresh(plan: Mapping[str, Any], spec_path: str | None) -> str | None:
    """Raise :class:`StalePlanError` unless the plan can run; returns the spec file it was checked against."""
    from .. import __version__, load
    from ..plan import FORMAT

    if plan.get("format") != FORMAT:
        raise StalePlanError(f"plan format {plan.get('format')!r} is not {FORMAT!r}; re-run `topo plan`")
    if _major(plan.get("topo_version")) != _major(__version__):
        raise StalePlanError(
            f"plan written by topo {plan.get('topo_version')}, this is topo {__version__}; re-run `topo plan`")
    recorded = plan.get("spec") or {}
    path = spec_path or recorded.get("path")
    if not path or not os.path.isfile(path):
        return None
    digest = load(path, recorded.get("variables") or {}).sha256
    if digest != recorded.get("sha256"):
        raise StalePlanError(
            f"plan is stale: {path} changed since the plan was written "
            f"(sha256 {digest[:12]} != {str(recorded.get('sha256'))[:12]}); re-run `topo plan`")
    return path


def _major(version: Any) -> str:
    return str(version).split(".")[0]


def shutdown_budget(plan: Mapping[str, Any]) -> float:
    """Seconds the collector gets to close every env: the plan's, or sized to the largest subcollector."""
    given = plan["launch"].get("shutdown_timeout")
    if given is not None:
        return float(given)
    largest = max(sub["num_workers"] for sub in plan["subcollectors"])
    return SHUTDOWN_BASE_S + SHUTDOWN_PER_WORKER_S * largest


def resolve(source: Any, variables: Mapping[str, str] | None = None, spec_path: str | None = None) -> dict:
    """The plan to run: a plan dict as given, a saved plan still fresh, or a spec compiled now.

    Compiler warnings and notes go to stderr, as ``topo plan`` prints them.
    """
    from .. import compile_source, load, render

    if isinstance(source, dict):
        return source
    path = os.fspath(source)
    plan = read_plan(path)
    if plan is None:
        if spec_path:
            raise UsageError("spec= (--spec) only applies to a saved plan")
        return compile_source(load(path, variables or {}),
                              on_warnings=lambda found: print(render.diagnostics_text(found), end="", file=sys.stderr))
    if variables:
        raise UsageError("template variables (--set) only apply to a spec: a plan is already rendered")
    if check_fresh(plan, spec_path) is None:
        print(f"note: spec {(plan.get('spec') or {}).get('path')!r} not found: the plan was not checked against it"
              " (pass --spec)", file=sys.stderr)
    return plan
