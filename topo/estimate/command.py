"""The CLI side: ``topo plan SPEC --estimate`` (:func:`estimate`) and the memory check ``topo launch`` runs before
any process starts (:func:`launch_check`). Imports no torch: the probe runs in a child (:mod:`.probe`).

Budgets: this host's available memory (MemAvailable) and cores; under Ray each declared node's ``memory_gb``
and ``cpus`` (``placement.nodes`` of the plan's spec), the trainer on this host.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import time
from typing import Any, Mapping

import click

from topo.diagnostics import Diagnostic, error
from topo.errors import SpecError
from topo.estimate import cache, host, model
from topo.estimate.model import HOST, UNPLACED, Budget, Layout
from topo.estimate.probe import STEPS

FIELD = ("topology", "workers_per_subcollector")  # where a refusal points in the spec
PROBE_VERSION = 2  # what a probe measures; a cached probe of another version is measured again


def estimate(plan: dict, fmt: str = "text", *, reprobe: bool = False, force: bool = False,
             target: float | None = None, source=None) -> dict[str, Any]:
    """Probe (or read the cache), predict, print; raises :class:`SpecError` (exit 2) when a node's memory is
    exceeded, unless ``force``. ``source``: the loaded spec, to place the refusal at its line."""
    backend = _backend(plan)
    fields, request = probe_request(plan, backend)
    result = None if reprobe else cache.load(fields)
    probe_info: dict[str, Any] = {"source": "cache", "key": cache.key(fields)[:12]}
    if result is None:
        from topo.estimate import probe

        started = time.monotonic()
        result = {**probe.run(request), "measured_at": time.time()}
        probe_info = {"source": "measured now", "key": cache.key(fields)[:12], "seconds": round(time.monotonic() - started, 1),
                      "cache": str(cache.save(fields, result))}
    footprint, pace = model.probed(result, horizon(plan, backend))
    layout = Layout.of(plan)
    budgets = node_budgets(plan, source.data if source is not None else None)
    out = predict(layout, footprint, pace, budgets, target, renders=bool(backend and backend.renders))
    out["probe"] = {**probe_info, "result": result}
    click.echo(json.dumps(out, indent=1, default=str) if fmt == "json" else text(plan, out))
    if out["refusals"] and not force:
        raise SpecError([refusal(out["refusals"], plan, source)])
    return out


def predict(layout: Layout, footprint: model.Footprint, pace: model.Pace, budgets: Mapping[str, Budget],
            target: float | None = None, renders: bool = False) -> dict[str, Any]:
    """Everything the estimate says, as JSON data (the model's figures, rounded)."""
    checked = model.check(layout, footprint, budgets)
    nodes = {name: {**{k: v for k, v in entry.items() if k != "memory"}, "arithmetic": entry["memory"].terms(),
                    "budget": budgets[name].source if name in budgets else None}
             for name, entry in checked["nodes"].items()}
    fps = model.frames(layout, pace, budgets)
    return {"shape": layout.shape, "footprint_gb": {k: round(v, 3) if isinstance(v, float) else v
                                                    for k, v in vars(footprint).items()},
            "nodes": nodes, "ready": model.ready(layout, pace, budgets),
            "frames_per_s": {k: round(v, 4) if isinstance(v, float) else v for k, v in fps.items()},
            "refusals": checked["refusals"], "warnings": checked["warnings"],
            "gpu": model.gpu_notes(layout, footprint, renders),
            "target": None if target is None else model.target(target, layout, footprint, pace, budgets)}


def eval_duration(plan: dict) -> str:
    """``topo eval`` of a protocol, before it starts: how long its episodes take here at most, from a probe of one
    of its workers (cached, else measured now, in a child process)."""
    backend = _backend(plan)
    first = plan["subcollectors"][0]["workers"][0]
    bare = {**first, "kwargs": {k: v for k, v in first["kwargs"].items() if k != "schedule"}}  # a worker, not its episodes
    fields, request = probe_request({**plan, "subcollectors": [{**plan["subcollectors"][0], "workers": [bare]}]},
                                    backend)
    result, how = cache.load(fields), "a cached probe of one worker"
    if result is None:
        from topo.estimate import probe

        result = {**probe.run(request), "measured_at": time.time()}
        cache.save(fields, result)
        how = "a probe of one worker, measured now"
    _, pace = model.probed(result)
    section = {"subcollectors": plan["subcollectors"]}
    d = model.eval_duration(section, pace, os.cpu_count() or 1, backend.horizon_key if backend else None)
    hours, rest = divmod(round(d["seconds"]), 3600)
    return (f"expected here: at most {hours} h {rest // 60} min ({d['episodes']} episode(s), each to its horizon: "
            f"{d['steps']} steps over {d['workers']} eval workers on {d['cores']} cores, bound by {d['bound_by']}; "
            f"from {how}: a step {pace.step_mean * 1000:.0f} ms, a forward {pace.forward * 1000:.0f} ms)")


def launch_check(plan: dict, *, force: bool = False, quiet: bool = False) -> None:
    """Before a launch starts anything: its memory on each node, from a cached probe of this plan if there is
    one, else the backend's declared memory per worker (said which); refused (exit 2) unless ``force``."""
    backend = _backend(plan)
    result = cache.load(probe_request(plan, backend)[0])
    footprint = model.probed(result)[0] if result else model.declared(backend.memory_per_worker_gb if backend else None)
    checked = model.check(Layout.of(plan), footprint, node_budgets(plan))
    where = ("a cached probe of this plan (topo plan --estimate)" if result else
             "the backend's declared memory per worker (no cached probe: topo plan SPEC --estimate measures one)")
    if not quiet:
        for name, entry in checked["nodes"].items():
            if entry["available_gb"] is not None:
                click.echo(f"memory on {name}: {entry['memory'].terms()} = {entry['memory'].gb:.1f} GB of "
                           f"{entry['usable_gb']:.1f} GB usable ({model.USABLE:.0%} of {entry['available_gb']:.1f} GB "
                           f"available), from {where}", err=True)
    if checked["refusals"] and not force:
        raise SpecError([refusal(checked["refusals"], plan, None, f"(figures from {where})")])
    if checked["refusals"] and not quiet:
        click.echo("warning: --force: launching anyway: " + "; ".join(checked["refusals"]), err=True)


def probe_request(plan: Mapping[str, Any], backend) -> tuple[dict[str, Any], dict[str, Any]]:
    """The cache key's fields and the probe's request: the plan's first row, its policy at the request size."""
    row = plan["subcollectors"][0]["workers"][0]
    policy = plan.get("policy") or {}
    forward = None
    if policy.get("factory"):
        forward = {"factory": policy["factory"], "kwargs": policy.get("kwargs") or {}, "device": policy.get("device"),
                   "batch": max(s["num_workers"] for s in plan["subcollectors"])}
    request = {"kwargs": row["kwargs"], "steps": STEPS, "policy": forward, "preload": forked_from(plan)}
    reserved = backend.reserved if backend is not None else frozenset()
    fields = {"probe": PROBE_VERSION, "worker": cache.shared(row["kwargs"], reserved), "steps": request["steps"],
              "policy": forward,
              "preload": request["preload"], "host": cache.fingerprint()}
    return fields, request


def forked_from(plan: Mapping[str, Any]) -> list[str] | None:
    """What the parent of the plan's workers imports before it forks them: a preloading forkserver's modules, or a
    subcollector's torch and torchrl.envs (``fork``); None: spawned workers."""
    start, preload = plan["start_methods"]["workers"], plan["launch"].get("preload")
    if (plan.get("collector") or {}).get("mode") == "async":
        return None
    return list(preload) if start == "forkserver" and preload else ["torch", "torchrl.envs"] if start == "fork" else None


def horizon(plan: Mapping[str, Any], backend) -> int | None:
    """The episode length the plan's workers are built with (the backend's horizon kwarg), if it says."""
    key = backend.horizon_key if backend is not None else None
    return plan["subcollectors"][0]["workers"][0]["kwargs"]["env"].get(key) if key else None


def node_budgets(plan: Mapping[str, Any], spec_data: Any = None) -> dict[str, Budget]:
    """This host's, and under Ray each declared node's (read from the plan's spec when ``spec_data`` is None)."""
    cores = os.cpu_count() or 1
    budgets = {HOST: Budget(host.available_gb(), cores, "MemAvailable"), UNPLACED: Budget(None, cores, "no declared node")}
    if (plan.get("placement") or {}).get("engine") != "ray":
        return budgets
    data = spec_data if spec_data is not None else _spec_data(plan)
    for kind in ((data or {}).get("placement") or {}).get("nodes") or []:
        count = kind.get("count", 1)
        for i in range(count):
            budgets[f"{kind['name']}#{i}" if count > 1 else kind["name"]] = Budget(
                kind.get("memory_gb"), int(kind.get("cpus") or cores), "declared memory_gb")
    return budgets


def refusal(refusals: list[str], plan: Mapping[str, Any], source=None, note: str = "") -> Diagnostic:
    d = error("memory-exceeds-node", "; ".join(refusals) + (f" {note}" if note else ""), FIELD,
              "fewer workers per subcollector (or a bigger node); --force proceeds anyway")
    if source is not None:
        return source.place(d)
    return Diagnostic(d.code, d.severity, d.message, d.path, d.hint, file=(plan.get("spec") or {}).get("path"))


def text(plan: Mapping[str, Any], out: dict[str, Any]) -> str:
    """The estimate for people: the probe, per node its memory, ready time, frames/s, iteration time."""
    r, fp = out["probe"]["result"], out["footprint_gb"]
    steps, policy, probe = r["steps"], r.get("policy"), out["probe"]
    when = datetime.datetime.fromtimestamp(r.get("measured_at") or 0).strftime("%Y-%m-%d %H:%M")
    how = f"measured now in {probe['seconds']} s" if probe["source"] != "cache" else f"cached, measured {when}"
    lines = [f"estimate: {plan['name']} ({out['shape']}), probe {how} (key {probe['key']})",
             f"one worker alone: start + imports {(r.get('start_s') or 0) + r['imports_s']:.2f} s, construction "
             f"{r['construct_s']:.2f} s, first reset {r['reset_s']:.2f} s; a step p50 {_ms(steps['p50_s'])}, p95 "
             f"{_ms(steps['p95_s'])}, {_ms(steps['cpu_mean_s'])} CPU; resident {r['rss_after_reset_bytes'] / 2**30:.2f} GB "
             f"after reset, peak {fp['worker_gb']:.2f} GB",
             f"a process with torch + torchrl alone: {fp['process_gb']:.2f} GB"]
    if policy:
        lines.append(f"policy {plan['policy']['factory']}: one forward of {policy['batch']} observations "
                     f"{_ms(policy['forward_s'])} on {policy['device']}, {policy['param_bytes'] / 2**20:.1f} MB of parameters")
    lines.append("")
    for name, n in out["nodes"].items():
        if n["available_gb"] is None:
            verdict = f"not checked ({n['budget']})"
        else:
            per = n.get("fits_per_subcollector")
            verdict = (f"{'fits' if n['fits'] else 'DOES NOT FIT'} in {n['usable_gb']:.1f} GB, {model.USABLE:.0%} of "
                       f"{n['available_gb']:.1f} GB available ({n['budget']})"
                       + (f"; up to {per} workers per subcollector" if per is not None else ""))
        lines.append(f"memory on {name}: {n['arithmetic']} = {n['gb']:.1f} GB; {verdict}")
    ready, f = out["ready"], out["frames_per_s"]
    if ready:
        lines.append(f"ready in ~{ready['s']:.1f} s; at least {ready['bound_s']:.1f} s, the bound of {ready['mode']}: "
                     f"max(chain {ready['chain_s']:.1f} s, work {ready['work_s']:.1f} CPU-s / "
                     f"{out['nodes'][ready['node']]['cores']} cores)")
    lines.append(f"frames/s: sync {f['sync']:.1f}, async {f['async']:.1f}; the CPU allows {f['cpu_cap']:.1f} "
                 f"({_ms(f['cpu_s_per_frame'])} CPU per frame), bound by the {'CPU' if f['bound_by'] == 'cpu' else 'steps'}")
    if f["iteration_s"] is not None:
        lines.append(f"a training iteration ({plan['collector']['frames_per_batch']} frames, {f['mode']}): "
                     f"~{f['iteration_s']:.3g} s")
    if out["target"]:
        t = out["target"]
        lines.append(f"target {t['frames_per_s']:g} frames/s: " + (f"{t['shape']} ({t['predicted']:.1f} predicted)"
                                                                    if t["shape"] else f"none: {t['why']}"))
    lines += [f"gpu (not measured): {note}" for note in out["gpu"]]
    lines += [f"warning: {w}" for w in out["warnings"]]
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _backend(plan: Mapping[str, Any]):
    from topo.backends import get_backend

    try:
        return get_backend(plan["env"]["backend"])
    except (KeyError, LookupError):
        return None


def _spec_data(plan: Mapping[str, Any]) -> Any:
    """The plan's spec as loaded data, when it is still there and unchanged (None otherwise)."""
    from topo.compiler.load import load

    spec = plan.get("spec") or {}
    try:
        source = load(spec["path"], spec.get("variables") or {})
    except (KeyError, OSError, SpecError):
        return None
    return source.data if source.sha256 == spec.get("sha256") else None
