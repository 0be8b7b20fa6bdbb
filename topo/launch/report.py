"""The launch report: ``summary.json`` and a short human summary, from what the supervisor saw."""
from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from . import observe
from .supervisor import Outcome

ROLES = ("top", "collector", "subcollector", "worker")


def summary(outcome: Outcome) -> dict[str, Any]:
    state, plan = outcome.state, outcome.state.plan
    workers = list(state.workers.values())
    built = Counter(state.role_of(pid) for w in workers for pid, _ in w.constructions)
    ready = state.events.get("ready")
    first = state.events.get("batch")
    shutdown = state.events.get("shutdown")
    last_close = max((w.closed for w in workers if w.closed), default=None)
    error = outcome.error
    return {
        "ok": error is None,
        "exit_code": 0 if error is None else error.exit_code,
        "error": None if error is None else {
            "type": type(error).__name__, "message": str(error), "formatted": error.format(),
            "subcollector": getattr(error, "subcollector", None), "worker": getattr(error, "worker", None),
        },
        "command": outcome.options.command,
        "run_dir": state.run.path,
        "topology": {"subcollectors": len(plan["subcollectors"]), "workers": len(workers),
                     "workers_per_subcollector": [s["num_workers"] for s in plan["subcollectors"]],
                     "sync": plan["collector"]["sync"], "start_methods": plan["start_methods"]},
        "launch": {"batches_requested": outcome.options.batches,
                   "batches_collected": (state.events.get("collected") or {}).get("batches", 0),
                   "startup_timeout_s": outcome.startup_timeout, "shutdown_budget_s": outcome.shutdown_budget,
                   "max_concurrent_starts": outcome.max_concurrent_starts,
                   "peak_concurrent_starts": _peak_concurrent(workers)},
        "constructions": {"by_role": {role: built.get(role, 0) for role in ROLES},
                          "expected": {"top": 0, "collector": 0, "subcollector": 0, "worker": len(workers)}},
        "timings_s": {
            # the serial chain before any env worker can start: collector, then subcollector, imports
            "subcollectors_up": (_since(state, max(state.subcollector_up.values()))
                                 if len(state.subcollector_up) == len(plan["subcollectors"]) else None),
            # every worker in its factory (process started, imports done), then every env built
            "workers_started": _since(state, _last([w.started for w in workers])),
            "workers_built": _since(state, _last([w.constructed for w in workers])),
            "all_ready": _since(state, ready and ready["time"]),
            "first_batch": _since(state, first and first["time"]),
            "worker_build": _stats([w.build_s for w in workers]),
            "shutdown": _delta(shutdown and shutdown["started"], shutdown and shutdown["time"]),
            "worker_close": _stats([w.close_s for w in workers]),
            "first_to_last_close": _delta(shutdown and shutdown["started"], last_close),
            "teardown": _delta(outcome.teardown_started, outcome.finished),
            "total": _delta(state.t0, outcome.finished),
        },
        "processes": {
            "peak_descendants": state.peak_descendants,
            "collector_pid": state.runner_pid,
            "collector_exit_code": outcome.runner_exit_code,
            "subcollector_pids": [state.subcollector_pids.get(sub["index"]) for sub in plan["subcollectors"]],
            "subcollector_start_methods": [state.subcollector_start_methods.get(sub["index"])
                                           for sub in plan["subcollectors"]],
            "subcollector_exit_codes": (shutdown or {}).get("exit_codes"),
            "worker_pids": [w.pid for w in workers],
            "started": sorted(state.tracked.procs),
            "left_behind": outcome.left_behind,
            "killed": outcome.killed,
            "alive_after": outcome.alive_after,
        },
        "env_closes": {"constructed": sum(len(w.constructions) for w in workers),
                       "closed": sum(w.closes for w in workers)},
        "first_batch": observe.check(plan, state.batches),
        "render_devices": _render_devices(workers),
        "inherited_gl": {"workers": sum(1 for w in workers if w.inherited_gl),
                         "libraries": sorted({lib for w in workers for lib in w.inherited_gl})},
        "seeds": {"checked": sum(1 for w in workers if w.constructed),
                  "mismatches": [{"subcollector": w.subcollector, "worker": w.index, "planned": w.row["seed"],
                                  "applied": w.seed} for w in workers if w.constructed and w.seed != w.row["seed"]]},
        "plan": plan,
    }


def _render_devices(workers) -> list[dict]:
    """Each distinct device the builders resolved, with the workers on it (planned CUDA index vs. EGL device)."""
    seen: dict[str, dict] = {}
    for w in workers:
        if w.render_device:
            key = json.dumps(w.render_device, sort_keys=True)
            seen.setdefault(key, {**w.render_device, "planned": w.row["render_gpu"], "workers": 0})["workers"] += 1
    return list(seen.values())


def _peak_concurrent(workers) -> int:
    edges = sorted([(w.started, 1) for w in workers if w.started]
                   + [(w.constructed, -1) for w in workers if w.started and w.constructed])
    peak = level = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def _last(times: list[float | None]) -> float | None:
    return None if not times or None in times else max(times)


def _since(state, t: float | None) -> float | None:
    return None if t is None else round(t - state.t0, 3)


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)


def _stats(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": round(min(values), 3), "mean": round(sum(values) / len(values), 3), "max": round(max(values), 3)}


def write(summary_: dict, directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "summary.json")
    with open(path, "w") as f:
        json.dump(summary_, f, indent=1)
        f.write("\n")
    return path


def human(s: dict) -> str:
    """A few lines: outcome, constructions per role, timings, closes, leftovers, first-batch check."""
    t, p, c = s["timings_s"], s["processes"], s["constructions"]["by_role"]
    topo = s["topology"]
    outcome = "ok" if s["ok"] else "interrupted" if s["error"]["type"] == "Interrupted" else "FAILED"
    lines = [
        f"launch {outcome}: {topo['subcollectors']} subcollector(s), {topo['workers']} env workers, "
        f"{s['launch']['batches_collected']}/{s['launch']['batches_requested']} batch(es)",
        "  env constructions: " + ", ".join(f"{role} {c[role]}" for role in ROLES)
        + f" (expected worker {s['constructions']['expected']['worker']}, others 0)",
        f"  all ready {_fmt(t['all_ready'])}, first batch {_fmt(t['first_batch'])}, "
        f"shutdown {_fmt(t['shutdown'])} (budget {s['launch']['shutdown_budget_s']:g}s)",
        f"  env closes {s['env_closes']['closed']}/{s['env_closes']['constructed']}, subcollector exit codes "
        f"{p['subcollector_exit_codes']}, peak descendants {p['peak_descendants']}",
        f"  left behind {len(p['left_behind'])}, alive after {len(p['alive_after'])}",
    ]
    for d in s.get("render_devices") or []:  # the planned id in its numbering, and the EGL device it resolved to
        planned, egl, cuda = d.get("planned"), d.get("egl_device"), d.get("cuda_device")
        if planned is None:
            gpu = "cpu"
        elif d.get("numbering", "cuda") == "cuda":
            gpu = f"cuda {planned} -> egl {egl}"
        elif d.get("fallback"):
            gpu = f"egl {planned} -> egl {egl} with CUDA_VISIBLE_DEVICES={d['fallback']} (device-zero fallback)"
        else:
            gpu = f"egl {planned} " + (f"(cuda {cuda})" if cuda is not None else "(no CUDA device)")
        lines.append(f"  render: {d.get('gl')} {gpu}, {d.get('renderer')}: {d['workers']} worker(s)")
    inherited = s.get("inherited_gl") or {}
    if inherited.get("workers"):
        lines.append(f"  WARNING: {inherited['workers']} worker(s) had GL/CUDA libraries loaded before their builder ran "
                     f"({', '.join(inherited['libraries'])}): state from a parent process, or from MUJOCO_GL at import")
    checks = Counter(entry["status"] for entry in s["first_batch"])
    lines.append("  first batch vs plan: " + ", ".join(f"{n} {status}" for status, n in sorted(checks.items()))
                 + (f"; seeds: {len(s['seeds']['mismatches'])} mismatch(es) of {s['seeds']['checked']}"))
    for entry in s["first_batch"]:
        seen = entry.get("instructions") or []
        if seen:
            groups = entry.get("groups") or []
            lines.append(f"    sub{entry['subcollector']} [{entry['status']}] groups {groups}: "
                         + "; ".join(repr(text) for text in seen))
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"
