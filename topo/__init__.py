"""topo: a declarative compiler for TorchRL environment topologies.

A training script (nothing but :func:`collector` and :meth:`Plan.make_policy` imports torch)::

    import topo
    plan = topo.load("examples/toy_2x3.yaml")            # a spec or a saved plan, checked: a topo.Plan
    with topo.collector(plan, policy=plan.make_policy()) as run:
        for i, batch in zip(range(3), run.collector):     # the torchrl collector, supervised
            run.update_weights()                          # your update first; then every copy acts with it

The compiler, as the CLI runs it::

    source = topo.load_spec("spec.yaml.j2", {"workers": "8"})  # read + render + parse, located
    checked = topo.validate(source)                           # every diagnostic at once
    plan_dict = topo.compile_spec("spec.yaml")                # the plan dict, or SpecError
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topo.version import __version__

from topo.errors import LaunchError, SpecError, StalePlanError, TopoError, UsageError
from topo.compiler.load import Source
from topo.compiler.load import load as load_spec
from topo.compiler.plan import compile_source, compile_spec
from topo.compiler.validate import Checked, validate
from topo.api import Plan, PlanSource, Row, Subcollector, collector, eval_table, load
from topo.runtime.episodes import EpisodeId, Episodes, episode_id

if TYPE_CHECKING:
    from topo.launch.run import Run


__all__ = [
    "Checked", "EpisodeId", "Episodes", "LaunchError", "Plan", "PlanSource", "Row", "Run", "Source", "SpecError", "StalePlanError", "Subcollector",
    "TopoError", "UsageError", "__version__", "collector", "compile_source", "compile_spec", "episode_id", "eval_table", "load",
    "load_spec", "validate",
]


def __getattr__(name: str) -> Any:
    """``topo.Run`` (the class :func:`collector` returns) imports torch: only when it is asked for."""
    if name == "Run":
        from topo.launch.run import Run

        return Run
    raise AttributeError(f"module 'topo' has no attribute {name!r}")
