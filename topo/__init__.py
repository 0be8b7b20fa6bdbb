"""topo: a declarative compiler for TorchRL environment topologies.

Python API (mirrors the CLI; none of it imports torch)::

    import topo
    source = topo.load("spec.yaml", {"workers": "8"})   # read + render + parse, located
    checked = topo.validate(source)                     # every diagnostic at once
    plan = topo.compile_spec("spec.yaml")                # the plan dict, or SpecError
"""
from __future__ import annotations

__version__ = "0.1.0"

from typing import Mapping

from .errors import LaunchError, SpecError, StalePlanError, TopoError
from .load import Source, load
from .validate import Checked, validate

__all__ = [
    "Checked", "LaunchError", "Source", "SpecError", "StalePlanError", "TopoError",
    "compile_source", "compile_spec", "load", "validate",
]


def compile_source(source: Source, *, strict: bool = False) -> dict:
    """The plan of a loaded spec. Raises :class:`SpecError` on errors (or warnings, when strict)."""
    from .plan import compile_checked

    checked = validate(source)
    if strict and checked.warnings:
        raise SpecError(checked.diagnostics)
    return compile_checked(source, checked)


def compile_spec(path, variables: Mapping[str, str] | None = None, *, strict: bool = False) -> dict:
    """Load, validate and compile the spec at ``path`` into a plan dict."""
    return compile_source(load(path, variables), strict=strict)
