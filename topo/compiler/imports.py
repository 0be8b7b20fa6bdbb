"""The code a plan names: each ``module:callable`` that launching it imports and calls, read from the plan alone.

A spec names callables by design (an env backend's builder, a user factory, an env transform, a policy
factory), as Hydra's ``_target_`` does; launching its plan imports those modules in the trainer and the
workers. ``topo plan`` and ``topo launch`` of a saved plan list them (:func:`describe`) before anything runs.
Imports nothing.
"""
from __future__ import annotations

from typing import Any, Mapping

USER_BUILDER = "topo.envs.user:build"  # a user factory's builder: the factory itself is in each row's env


def callables(plan: Mapping[str, Any]) -> dict[str, str]:
    """``{"module:callable": its role}`` of every callable ``plan`` names, in the order a launch reaches them."""
    found: dict[str, str] = {}

    def add(path: Any, role: str) -> None:
        if isinstance(path, str) and ":" in path:
            found.setdefault(path, role)

    def envs(kwargs: Mapping[str, Any]) -> None:
        add(kwargs.get("builder"), "env builder")
        if kwargs.get("builder") != USER_BUILDER:
            return
        inner = [kwargs.get("env")]
        schedule = kwargs.get("schedule")  # an eval row's: one env's kwargs per task
        if isinstance(schedule, dict) and isinstance(schedule.get("envs"), dict):
            inner += list(schedule["envs"].values())
        for env in inner:
            if isinstance(env, dict):
                add(env.get("factory"), "env factory")

    env = plan.get("env")
    if isinstance(env, dict):
        add(env.get("builder"), "env builder")
        for item in env.get("transforms") or []:
            add(item.get("name") if isinstance(item, dict) else None, "env transform")
    sections = [plan.get("subcollectors"), (plan.get("eval") or {}).get("subcollectors")]
    for subs in sections:
        for sub in subs if isinstance(subs, list) else []:
            for row in (sub.get("workers") or []) if isinstance(sub, dict) else []:
                if isinstance(row, dict) and isinstance(row.get("kwargs"), dict):
                    envs(row["kwargs"])
    policy = plan.get("policy")
    if isinstance(policy, dict):
        add(policy.get("factory"), "policy factory")
    return found


def describe(plan: Mapping[str, Any]) -> str:
    """One line: the modules launching ``plan`` imports, each with the callables it names there."""
    by_module: dict[str, list[str]] = {}
    for path, role in callables(plan).items():
        by_module.setdefault(path.partition(":")[0], []).append(f"{role} {path}")
    if not by_module:
        return "launching this plan imports no module it names"
    parts = [f"{module} ({', '.join(uses)})" for module, uses in by_module.items()]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"launching this plan imports {listed}"
