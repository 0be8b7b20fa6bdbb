"""Turn bench runs into ``comparison.json``: per mode min/median/max, paired ratios, the lower bound."""
from __future__ import annotations

import statistics
from typing import Any

from ..launch.report import ROLES
from .modes import BASELINE


PHASES = ("subcollectors_up", "workers_started", "workers_built", "all_ready")


def spread(values: list[float | None]) -> dict[str, float] | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3), "n": len(values)}


def lower_bound(workers: int, single_wall_s: float, cores: int) -> float:
    """N workers x one worker's cost / usable cores: no mode can start the topology faster."""
    return workers * single_wall_s / max(cores, 1) if workers >= cores else single_wall_s


def comparison(runs: list[dict[str, Any]], singles: list[dict[str, Any]], workers: int, cores: int,
               modes: list[str]) -> dict[str, Any]:
    single_wall = spread([s["wall_s"] for s in singles])
    bound = lower_bound(workers, single_wall["median"], cores) if single_wall else None
    per_mode = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        summaries = [r["summary"] for r in mine if r["summary"]]
        built = {role: max((s["constructions"]["by_role"].get(role, 0) for s in summaries), default=None)
                 for role in ROLES}
        ready = spread([_t(r, "all_ready") for r in mine])
        per_mode[mode] = {
            "runs": len(mine),
            "ok": sum(1 for r in mine if r["exit_code"] == 0),
            "constructions": built,
            "all_ready_s": ready,
            "first_batch_s": spread([_t(r, "first_batch") for r in mine]),
            "peak_processes": max((s["processes"]["peak"] or 0 for s in summaries), default=None),
            "peak_rss_gb": round(max((r["peak_rss_gb"] for r in mine), default=0), 2),
            "lingering": max((len(s["processes"]["alive_after"]) for s in summaries), default=None),
            "ratio_to_lower_bound": round(ready["median"] / bound, 3) if ready and bound else None,
            # where startup goes: medians of seconds since launch at each step
            "phases_s": {phase: (spread([_t(r, phase) for r in mine]) or {}).get("median") for phase in PHASES},
        }
    rounds = sorted({r["round"] for r in runs})
    per_round = []
    for i in rounds:
        entry: dict[str, Any] = {"round": i}
        base = next((r for r in runs if r["round"] == i and r["mode"] == BASELINE), None)
        for r in (r for r in runs if r["round"] == i):
            ready, first = _t(r, "all_ready"), _t(r, "first_batch")
            entry[r["mode"]] = {
                "all_ready_s": ready, "first_batch_s": first,
                "speedup_vs_legacy": round(_t(base, "all_ready") / ready, 3) if base and ready and _t(base, "all_ready") else None,
            }
        per_round.append(entry)
    for mode in modes:
        ratios = [e[mode]["speedup_vs_legacy"] for e in per_round if mode in e and e[mode]["speedup_vs_legacy"]]
        per_mode[mode]["speedup_vs_legacy_median"] = round(statistics.median(ratios), 3) if ratios else None
    base = per_mode.get(BASELINE, {}).get("all_ready_s")
    chain = spread([_t(r, "subcollectors_up") for r in runs])
    # the most a mode can gain over legacy when every worker repeats its imports (spawn): its workers start
    # after the serial chain (collector, then subcollector imports) and take at least the lower bound
    at_bound = round(base["median"] / (bound + (chain["median"] if chain else 0)), 3) if base and bound else None
    return {"workers": workers, "cores": cores, "single_worker": {
        "wall_s": single_wall,
        "imports_s": spread([s["imports_s"] for s in singles]),
        "construct_s": spread([s["construct_s"] for s in singles]),
        "reset_s": spread([s["reset_s"] for s in singles]),
    }, "lower_bound_s": round(bound, 3) if bound else None, "startup_chain_s": chain, "speedup_at_lower_bound": at_bound,
        "modes": per_mode, "rounds": per_round}


def _t(run: dict | None, key: str) -> float | None:
    if not run or not run.get("summary") or run["exit_code"] != 0:
        return None
    return run["summary"]["timings_s"].get(key)


def parent_envs(constructions: dict[str, int | None]) -> int:
    """Envs built in a process that is not an env worker (what worker metadata removes)."""
    return sum(constructions[r] or 0 for r in ROLES if r != "worker")


def table(result: dict[str, Any]) -> str:
    """The table in the form of the original measurement."""
    header = f"{'mode':<20} {'parent envs':>11} {'real envs':>9} {'all ready':>16} {'first batch':>16} {'x legacy':>8} {'x bound':>7}"
    lines = [header]
    for mode, m in result["modes"].items():
        c = m["constructions"]
        parent = parent_envs(c) if c["worker"] is not None else None
        lines.append(f"{mode:<20} {_n(parent):>11} {_n(c['worker']):>9} {_s(m['all_ready_s']):>16} "
                     f"{_s(m['first_batch_s']):>16} {_x(m['speedup_vs_legacy_median']):>8} {_x(m['ratio_to_lower_bound']):>7}")
    bound = result["lower_bound_s"]
    sw = result["single_worker"]["wall_s"]
    if bound is not None and sw:
        lines.append(f"lower bound {bound:.1f} s = {result['workers']} workers x {sw['median']:.1f} s (one worker alone) "
                     f"/ {result['cores']} cores")
    if result.get("speedup_at_lower_bound"):
        chain = result.get("startup_chain_s")
        after = f"{chain['median']:.1f} s of collector and subcollector imports, then " if chain else ""
        lines.append(f"a mode taking {after}the lower bound would be {result['speedup_at_lower_bound']:.2f}x legacy; "
                     "only shared imports (forkserver-preload, fork) go below the bound")
    return "\n".join(lines)


def phases(result: dict[str, Any]) -> str:
    """Per mode, the median second at which each startup step was done (a Markdown table)."""
    lines = ["| mode | subcollectors up | workers in their factory | envs built | all ready |", "|---|---|---|---|---|"]
    for mode, m in result["modes"].items():
        lines.append(f"| {mode} | " + " | ".join(_sec(m["phases_s"].get(p)) for p in PHASES) + " |")
    return "\n".join(lines)


def _sec(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def _n(v) -> str:
    return "-" if v is None else str(v)


def _s(sp: dict | None) -> str:
    return "-" if not sp else f"{sp['median']:.1f} s [{sp['min']:.0f}-{sp['max']:.0f}]"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}"
