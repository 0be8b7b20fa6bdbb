"""The topology rules, in the order the driver (:mod:`topo.validate`) runs them on a typed spec.

Each rule is ``rule(spec, ctx) -> list[Diagnostic]``; ``ctx`` (:class:`Context`) holds the backend
and its catalog, which :func:`context` resolves first.
"""
from __future__ import annotations

from topo.compiler.rules import blocks, groups, launch, placement, policy, render, seeds, tasks, topology, transforms
from topo.compiler.rules.async_mode import async_mode
from topo.compiler.rules.eval import evaluation_rules
from topo.compiler.rules.context import Context, context

RULES = [
    topology.shape,
    groups.groups,
    tasks.tasks,
    tasks.init_states,
    seeds.seeds,
    topology.start_methods,
    blocks.schema_kwargs,
    launch.launch,
    launch.recovery,
    launch.recycle,
    policy.policy,
    render.render_devices,
    placement.placement,
    evaluation_rules,
    async_mode,
    transforms.transforms,
]

__all__ = ["RULES", "Context", "context"]
