"""What ``topo launch`` runs: a spec compiled now, or a saved plan that must still match its spec.

Like ``terraform apply``, a saved plan is refused when it was written by an incompatible topo or
when its spec changed since (same variables, different sha256 of the rendered text); and, like any
input, when it is malformed or was changed after topo wrote it (:mod:`topo.compiler.planfile`).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping

from topo.compiler import planfile
from topo.diagnostics import Diagnostic
from topo.errors import StalePlanError, UsageError


def read_plan(path: str, *, allow_edited: bool = False, warnings: list[Diagnostic] | None = None) -> dict | None:
    """The plan saved at ``path``, checked (:func:`check_plan`); None when the file is not a plan (then it is a spec).

    A plan file must carry the digest ``topo plan -o`` writes: one without it, or whose content no
    longer matches it, is refused unless ``allow_edited`` (then ``warnings`` receives what changed).
    """
    plan = planfile.read(path)
    if plan is not None:
        found = planfile.check(plan, file=path, allow_edited=allow_edited, require_digest=True)
        if warnings is not None:
            warnings.extend(found)
    return plan


def check_plan(plan: Any, *, allow_edited: bool = False, name: str = "<plan>") -> list[Diagnostic]:
    """Raise :class:`SpecError` (exit 2, each field named) unless the in-memory ``plan`` can run as it is.

    A digest, when the plan has one, must match (unless ``allow_edited``); a plan fresh from
    :func:`topo.compile_spec` has none and needs none. Returns the warnings.
    """
    return planfile.check(plan, file=name, allow_edited=allow_edited)


def check_fresh(plan: Mapping[str, Any], spec_path: str | None) -> str | None:
    """Raise :class:`StalePlanError` unless the plan can run; returns the spec file it was checked against."""
    from topo.compiler.load import load

    planfile.check_compatible(plan)
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


def recording(plan: Mapping[str, Any]) -> str:
    """What the plan's env workers record (:mod:`topo.envs.recording`): ``"off"`` (``launch.provenance: false``),
    ``"actions"`` (``launch.record_actions: true``) or ``"episodes"``, the default."""
    launch = plan["launch"]
    if launch.get("provenance") is False:
        return "off"
    return "actions" if launch.get("record_actions") else "episodes"


#: what a spec's eval section keeps under an eval section put in its place (``eval_override``): where it runs
KEPT_EVAL = ("workers", "render_gpus", "render_devices", "exploration", "policy", "every", "async", "busy_policy")


def resolve(source: Any, variables: Mapping[str, str] | None = None, spec_path: str | None = None, *,
            allow_edited: bool = False, quiet: bool = False, eval_override: Mapping[str, Any] | None = None) -> dict:
    """The plan to run: a plan dict (checked), a saved plan (checked, and still fresh), or a spec compiled now.

    Compiler warnings and notes go to stderr, as ``topo plan`` prints them (``quiet``: errors only).
    ``eval_override`` (a spec only): an eval section in place of the spec's, which keeps its :data:`KEPT_EVAL`.
    """
    from topo.compiler import render
    from topo.compiler.load import load
    from topo.compiler.plan import compile_source

    def say(diagnostics: list[Diagnostic]) -> None:
        if diagnostics and not quiet:
            print(render.diagnostics_text(diagnostics), end="", file=sys.stderr)

    if isinstance(source, dict):
        say(check_plan(source, allow_edited=allow_edited))
        return source
    path = os.fspath(source)
    notes: list[Diagnostic] = []
    plan = read_plan(path, allow_edited=allow_edited, warnings=notes)
    say(notes)
    if plan is None:
        if spec_path or allow_edited:
            raise UsageError("--spec and --allow-edited-plan (spec=, allow_edited=) only apply to a saved plan")
        loaded = load(path, variables or {})
        if eval_override is not None and isinstance(loaded.data, dict):
            own = loaded.data.get("eval") if isinstance(loaded.data.get("eval"), dict) else {}
            loaded.data["eval"] = {**{k: v for k, v in own.items() if k in KEPT_EVAL}, **eval_override}
        return compile_source(loaded, on_warnings=say)
    if variables:
        raise UsageError("template variables (--set) only apply to a spec: a plan is already rendered")
    if check_fresh(plan, spec_path) is None and not quiet:
        print(f"note: spec {(plan.get('spec') or {}).get('path')!r} not found: the plan was not checked against it"
              " (pass --spec)", file=sys.stderr)
    if not quiet:
        from topo.compiler.imports import describe

        print(f"note: {describe(plan)}", file=sys.stderr)  # a saved plan names code: said before anything runs
    return plan
