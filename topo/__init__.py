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

from .errors import LaunchError, SpecError, StalePlanError, TopoError
from .load import Source, load
from .plan import compile_source, compile_spec
from .validate import Checked, validate

__all__ = [
    "Checked", "LaunchError", "Source", "SpecError", "StalePlanError", "TopoError", "__version__",
    "collector", "compile_source", "compile_spec", "load", "validate",
]


def collector(source, **options):
    """A supervised run of ``source`` (a spec, a saved plan, or a plan dict) for a training loop to iterate.

    See :class:`topo.launch.session.Run`; this imports torch.
    """
    from .launch.session import collector as run

    return run(source, **options)
