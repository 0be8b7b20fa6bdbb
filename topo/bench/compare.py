"""Turn bench runs into ``comparison.json``: per mode min/median/max, paired ratios, each mode's lower bound.

The lower bound of a mode (:mod:`.bound`) is what its process structure cannot go below on ``cores`` cores,
given one worker's phases measured alone (:mod:`.single`).

Everything after launch is counted (the trainer imports before the run's clock starts). The ratio of a
mode's median time to ready to its own bound is what the bound leaves out: contention (memory bandwidth,
software rendering threads), waiting, and the steps of startup that are not a worker's phases.
"""
from __future__ import annotations

import statistics
from typing import Any

from topo.runtime.rundir import ROLES
from topo.bench.bound import Costs, Shape, lower_bound
from topo.bench.modes import baseline as baseline_of

__all__ = ["Costs", "Shape", "comparison", "lower_bound", "table"]

PHASES = ("subcollectors_up", "workers_started", "workers_built", "all_ready")
COLD = "/cold"  # label suffix of a run started on an empty model cache


def split_mode(label: str) -> tuple[str, bool]:
    """``"fork/cold"`` -> ``("fork", True)``."""
    return (label[: -len(COLD)], True) if label.endswith(COLD) else (label, False)


def spread(values: list[float | None]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def single_phases(singles: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Spreads of one worker's phases (wall and CPU seconds), with ``shared_s`` (start + imports) and
    ``unshared_s`` (construct + reset)."""
    if not singles:
        return None
    out = {key: spread([s.get(key) for s in singles]) for key in
           ("wall_s", "start_s", "imports_s", "construct_s", "reset_s", "start_cpu_s", "imports_cpu_s",
            "construct_cpu_s", "reset_cpu_s")}
    out["shared_s"] = spread([(s.get("start_s") or 0.0) + s["imports_s"] for s in singles])
    out["unshared_s"] = spread([s["construct_s"] + s["reset_s"] for s in singles])
    return out


def costs_of(singles: list[dict[str, Any]]) -> Costs | None:
    """The medians a bound uses; ``compile``: a cold single worker's construction over a warm one's."""
    warm = single_phases([s for s in singles if not s.get("cold")])
    if warm is None:
        return None
    cold = single_phases([s for s in singles if s.get("cold")])

    def costs(cpu: str):
        if any(warm[f"{p}{cpu}_s"] is None for p in ("start", "imports", "construct", "reset")):
            return None
        m = {p: warm[f"{p}{cpu}_s"]["median"] for p in ("start", "imports", "construct", "reset")}
        extra = max(0.0, cold[f"construct{cpu}_s"]["median"] - m["construct"]) if cold else 0.0
        return m["start"] + m["imports"], m["construct"], m["reset"], extra

    wall = costs("") or (warm["shared_s"]["median"], warm["construct_s"]["median"], warm["reset_s"]["median"],
                         max(0.0, cold["construct_s"]["median"] - warm["construct_s"]["median"]) if cold else 0.0)
    cpu = costs("_cpu")
    return Costs(*wall, cpu=None if cpu is None else Costs(*cpu))


def comparison(runs: list[dict[str, Any]], singles: list[dict[str, Any]], shape: Shape, cores: int,
               labels: list[str], cap: int | None = None, model_cache: bool = False,
               own_builder: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """``runs`` (each with ``mode``: a label, ``round``, ``exit_code``, ``summary``...) per label, against
    the bounds from ``singles`` (one worker alone; ``cold``: on an empty model cache). Modes in ``own_builder``
    build their workers with another builder (``recipe``): no bound, no model cache. Every ratio is to the
    run's baseline (:func:`topo.bench.modes.baseline`)."""
    costs = costs_of(singles)
    base_label = baseline_of(labels)
    per_mode = {}
    for label in labels:
        mode, cold = split_mode(label)
        mine = [r for r in runs if r["mode"] == label]
        summaries = [r["summary"] for r in mine if r["summary"]]
        built = {role: max((s["constructions"]["by_role"].get(role, 0) for s in summaries), default=None)
                 for role in ROLES}
        ready = spread([_t(r, "all_ready") for r in mine])
        bound = lower_bound(mode, shape, costs, cores, cold=cold, cap=cap) if costs and mode not in own_builder else None
        per_mode[label] = {
            "runs": len(mine),
            "ok": sum(1 for r in mine if r["exit_code"] == 0),
            "model_cache": ("cold" if cold else "warm") if model_cache and mode not in own_builder else None,
            "constructions": built,
            "all_ready_s": ready,
            "first_batch_s": spread([_t(r, "first_batch") for r in mine]),
            "peak_processes": max((s["processes"]["peak"] or 0 for s in summaries), default=None),
            "peak_rss_gb": round(max((r["peak_rss_gb"] for r in mine), default=0), 2),
            # each env worker's peak resident memory (its own VmHWM, from its heartbeat), over every worker of every run
            "worker_peak_rss_mb": worker_memory(mine),
            "lingering": max((len(s["processes"]["alive_after"]) for s in summaries), default=None),
            "load_average_1m": [r.get("load_average_1m") for r in mine],
            "lower_bound": bound,
            "ratio_to_lower_bound": round(ready["median"] / bound["s"], 3) if ready and bound else None,
            # where startup goes: medians of seconds since launch at each step
            "phases_s": {phase: (spread([_t(r, phase) for r in mine]) or {}).get("median") for phase in PHASES},
        }
    rounds = sorted({r["round"] for r in runs})
    per_round = []
    for i in rounds:
        entry: dict[str, Any] = {"round": i}
        base = next((r for r in runs if r["round"] == i and r["mode"] == base_label), None)
        for r in (r for r in runs if r["round"] == i):
            ready, first = _t(r, "all_ready"), _t(r, "first_batch")
            entry[r["mode"]] = {
                "all_ready_s": ready, "first_batch_s": first,
                "speedup_vs_baseline": round(_t(base, "all_ready") / ready, 3) if base and ready and _t(base, "all_ready") else None,
            }
        per_round.append(entry)
    base = per_mode.get(base_label, {}).get("all_ready_s")
    for label in labels:
        m = per_mode[label]
        ratios = [e[label]["speedup_vs_baseline"] for e in per_round if label in e and e[label]["speedup_vs_baseline"]]
        m["speedup_vs_baseline_median"] = round(statistics.median(ratios), 3) if ratios else None
        # the most this mode could gain over the baseline: the baseline's median ready over this mode's bound
        m["speedup_at_lower_bound"] = round(base["median"] / m["lower_bound"]["s"], 3) if base and m["lower_bound"] else None
    return {"workers": shape.workers, "subcollectors": shape.subcollectors, "cores": cores, "baseline": base_label,
            "single_worker": {"warm": single_phases([s for s in singles if not s.get("cold")]),
                              "cold": single_phases([s for s in singles if s.get("cold")])},
            "costs_s": None if costs is None else costs.as_dict(),
            "startup_chain_s": spread([_t(r, "subcollectors_up") for r in runs]),
            "modes": per_mode, "rounds": per_round}


def worker_memory(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """min/median/max (and ``n``) of every env worker's peak resident memory, in MB, over ``runs``' reports."""
    peaks = [w.get("peak_rss_mb") for r in runs if r.get("summary")
             for w in ((r["summary"].get("memory") or {}).get("workers") or [])]
    return spread(peaks)


def _t(run: dict | None, key: str) -> float | None:
    if not run or not run.get("summary") or run["exit_code"] != 0:
        return None
    return run["summary"]["timings_s"].get(key)


def parent_envs(constructions: dict[str, int | None]) -> int:
    """Envs built in a process that is not an env worker (what worker metadata removes)."""
    return sum(constructions[r] or 0 for r in ROLES if r != "worker")


def table(result: dict[str, Any]) -> str:
    """Per mode: parent and real envs, time to ready and to first batch, x the baseline, its lower bound and the
    ratio, each worker's peak memory (median/max over workers, MB)."""
    header = (f"{'mode':<24} {'parent envs':>11} {'real envs':>9} {'all ready':>16} {'first batch':>16} "
              f"{'x ' + (result.get('baseline') or 'legacy'):>8} {'bound':>7} {'x bound':>7} {'worker MB':>11}")
    lines = [header]
    for mode, m in result["modes"].items():
        c = m["constructions"]
        parent = parent_envs(c) if c["worker"] is not None else None
        bound = m["lower_bound"]
        lines.append(f"{mode:<24} {_n(parent):>11} {_n(c['worker']):>9} {_s(m['all_ready_s']):>16} "
                     f"{_s(m['first_batch_s']):>16} {_x(m['speedup_vs_baseline_median']):>8} "
                     f"{'-' if not bound else format(bound['s'], '.1f') + ' s':>7} {_x(m['ratio_to_lower_bound']):>7} "
                     f"{_mb(m.get('worker_peak_rss_mb')):>11}")
    costs = result.get("costs_s")
    if costs:
        cold = f"; a cold cache adds one compile, {costs['compile']:.1f} s" if costs["compile"] else ""
        lines.append(f"one worker alone: start + imports {costs['shared']:.1f} s (shared: once per importing process), "
                     f"construction {costs['construct']:.1f} s + first reset {costs['reset']:.1f} s (never shared){cold}")
        lines.append(f"bound = max(chain, work / {result['cores']} cores), per mode's importing processes and parent envs "
                     "(topo bench --help, docs/benchmarks.md)")
    lines.append("worker MB: each env worker's peak resident memory (its VmHWM), median/max over the workers of every round")
    return "\n".join(lines)


def phases(result: dict[str, Any]) -> str:
    """Per mode, the median second at which each startup step was done (a Markdown table)."""
    lines = ["| mode | subcollectors up | workers in their factory | envs built | all ready |", "|---|---|---|---|---|"]
    for mode, m in result["modes"].items():
        lines.append(f"| {mode} | " + " | ".join(_sec(m["phases_s"].get(p)) for p in PHASES) + " |")
    return "\n".join(lines)


def _mb(sp: dict | None) -> str:
    return "-" if not sp else f"{sp['median']:.0f}/{sp['max']:.0f}"


def _sec(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _n(v) -> str:
    return "-" if v is None else str(v)


def _s(sp: dict | None) -> str:
    return "-" if not sp else f"{sp['median']:.1f} s [{sp['min']:.0f}-{sp['max']:.0f}]"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"
