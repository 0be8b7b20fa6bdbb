"""topo: a declarative compiler for TorchRL environment topologies.

Python API (mirrors the CLI; nothing but :func:`collector` imports torch)::

    import topo
    source = topo.load("spec.yaml", {"workers": "8"})   # read + render + parse, located
    checked = topo.validate(source)                     # every diagnostic at once
    plan = topo.compile_spec("spec.yaml")                # the plan dict, or SpecError
    with topo.collector("spec.yaml", policy_factory=make_policy, policy=policy) as run:
        for batch in run.collector:                     # the torchrl collector, supervised
            ...
            run.update_weights()
"""
from __future__ import annotations

from .version import __version__

from typing import Any, Callable, Mapping

from .errors import LaunchError, SpecError, StalePlanError, TopoError
from .load import Source, load
from .validate import Checked, validate

__all__ = [
    "Checked", "LaunchError", "Source", "SpecError", "StalePlanError", "TopoError", "__version__",
    "collector", "compile_source", "compile_spec", "load", "validate",
]


def compile_source(source: Source, *, strict: bool = False, on_warnings: Callable[[list], Any] | None = None) -> dict:
    """The plan of a loaded spec. Raises :class:`SpecError` on errors (or warnings, when strict);
    ``on_warnings`` receives the warnings of a spec that compiles."""
    from .plan import compile_checked

    checked = validate(source)
    if checked.errors or (strict and checked.warnings):
        raise SpecError(checked.diagnostics)
    if checked.warnings and on_warnings is not None:
        on_warnings(checked.warnings)
    return compile_checked(source, checked)


def compile_spec(path, variables: Mapping[str, str] | None = None, *, strict: bool = False) -> dict:
    """Load, validate and compile the spec at ``path`` into a plan dict."""
    return compile_source(load(path, variables), strict=strict)


def collector(source, **options):
    """A supervised run of ``source`` (a spec, a saved plan, or a plan dict) for a training loop to iterate.

    See :class:`topo.launch.session.Run`; this imports torch.
    """
    from .launch.session import collector as run

    return run(source, **options)
