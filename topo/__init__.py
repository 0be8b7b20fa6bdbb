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
from topo.api import Plan, PlanSource, Row, Subcollector, load
from topo.runtime.episodes import EpisodeId, Episodes, episode_id

if TYPE_CHECKING:
    from topo.launch.run import Run

__all__ = [
    "Checked", "EpisodeId", "Episodes", "LaunchError", "Plan", "PlanSource", "Row", "Source", "SpecError", "StalePlanError", "Subcollector",
    "TopoError", "UsageError", "__version__", "collector", "compile_source", "compile_spec", "episode_id", "eval_table", "load",
    "load_spec", "validate",
]


def collector(source: PlanSource | Plan, **options: Any) -> Run:
    """A supervised run of ``source`` for a training loop to iterate: a :class:`Plan` (from :func:`load`),
    a spec, a saved plan's path, or a plan dict (each checked).

    ``with topo.collector(plan, policy=plan.make_policy()) as run:`` starts it; ``run.collector`` is the
    torchrl collector, ``run.update_weights()`` pushes the trainer's weights, ``run.report`` is the report
    once the block ends. The options (``variables``, ``spec``, ``allow_edited`` for a path;
    ``policy``, ``policy_factory``, ``report_dir``, ``startup_timeout``, ..., and any torchrl collector
    keyword) are :func:`topo.launch.run.collector`'s. This imports torch.
    """
    if isinstance(source, Plan):  # unwrapped here: the run takes the plan dict, checked again
        given = sorted(key for key in ("variables", "spec") if options.get(key))
        if given:
            raise UsageError(f"{', '.join(given)}= apply when a plan is loaded: pass them to topo.load")
        options.setdefault("allow_edited", source.allow_edited)
        source = source.data
    from topo.launch.run import collector as run

    return run(source, **options)


def eval_table(result: dict[str, Any]) -> str:
    """An evaluation's result (``run.evaluate()``, ``run.evaluations``) as a person reads it: the headline
    (successes, rate, 95 % interval, the weights version) and one line per task, held-out ones marked."""
    from topo.launch.evaluation.results import table

    return table(result)
