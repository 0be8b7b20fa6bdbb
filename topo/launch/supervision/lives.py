"""Worker lives as plan rows: a restart, a recycle or a resumed run starts a subcollector's workers in a new life,
with the same rows and, in life ``k``, seed ``planned seed + k x N`` (N: workers in the plan), so that no two
workers of a run ever draw the same stream, and a rerun draws the same ones. Pure: no torch, no processes.
"""
from __future__ import annotations


SEED_SPAN = 2 ** 63  # seeds live in [0, 2**63): sequence seeds are 63-bit


def restart_seed(seed: int | None, restart: int, workers: int) -> int | None:
    """The seed of a worker planned with ``seed``, in restart ``restart`` of its subcollector."""
    if seed is None:
        return None
    out = seed + restart * workers
    return out - SEED_SPAN if out >= SEED_SPAN else out


def restart_rows(plan: dict, index: int, restart: int) -> list[dict]:
    """The plan rows of subcollector ``index`` as restart ``restart`` runs them: only the seed differs."""
    # N: every worker of the plan (a node's plan under async mode on Ray holds some subcollectors, its coverage all)
    n = (plan.get("coverage") or {}).get("workers") or sum(sub["num_workers"] for sub in plan["subcollectors"])
    rows = []
    for row in next(sub for sub in plan["subcollectors"] if sub["index"] == index)["workers"]:
        seed = restart_seed(row["seed"], restart, n)
        rows.append({**row, "seed": seed, "kwargs": _reseeded(row["kwargs"], seed)})
    return rows


def life_plan(plan: dict, life: int) -> dict:
    """``plan`` with every subcollector's rows as worker life ``life`` runs them (a resumed run's first start);
    ``plan`` itself for life 0."""
    if not life:
        return plan
    subs = [{**sub, "workers": restart_rows(plan, sub["index"], life)} for sub in plan["subcollectors"]]
    return {**plan, "subcollectors": subs}


def _reseeded(kwargs: dict, seed: int | None) -> dict:
    """A row's ``create_env_kwargs`` with ``seed``: applied by ``set_seed``, and passed to a user factory
    as its ``seed`` argument too (:mod:`topo.backends.callable` puts it there)."""
    out = {**kwargs, "seed": seed}
    env = out.get("env")
    inner = env.get("kwargs") if isinstance(env, dict) else None
    if isinstance(inner, dict) and "seed" in inner:
        out["env"] = {**env, "kwargs": {**inner, "seed": seed}}
    return out
