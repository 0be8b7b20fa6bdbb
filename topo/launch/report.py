"""The report of a run: ``summary.json`` and a short human summary, from what the run saw (:class:`Outcome`)."""
from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from topo.compiler import plan as _plan
from topo.diagnostics import ids_text
from topo.errors import TopoError
from topo.runtime import episodes
from topo.runtime import heartbeat, time_breakdown
from topo.runtime.rundir import ROLES
from topo.launch import observe
from topo.launch.ray import describe_placement
from topo.launch.supervision.state import RunState
from topo.launch.supervision.teardown import Record



@dataclass
class Outcome:
    """Everything a report reads: the run's state and teardown record, and what the trainer's side saw."""

    state: RunState
    error: BaseException | None  # what ended the run, as the report states it
    command: dict
    engine: str
    startup_timeout: float
    shutdown_budget: float
    max_concurrent_starts: int | None
    ready_at: float | None
    teardown: Record
    peak: int  # most processes of the run alive at once
    seen: set[int]  # every pid of the run seen alive
    policy: dict | None  # the policy placement's description
    torchrl: dict | None = None  # :meth:`topo.launch.boundary.Support.to_dict`
    extra: dict = field(default_factory=dict)  # what the caller adds to the launch section
    evaluation: dict | None = None  # :meth:`topo.launch.evaluation.service.EvalService.describe`
    memory: list[dict] = field(default_factory=list)  # :meth:`RunState.memory` at the end: each worker's latest
    actors: list[dict] | None = None  # Ray engine: each subcollector's planned and actual node (:mod:`.ray_placement`)
    batches: dict | None = None  # :meth:`topo.launch.digest.BatchDigest.describe`: the run's batches, digested
    time_breakdown: dict | None = None  # :meth:`topo.launch.run.Run.time_breakdown` at the end
    nodes: list[dict] | None = None  # async mode on Ray: each node run's report (:func:`merge_nodes`)


class Report:
    """``str(report)`` is the human summary; ``report.data`` the summary dict (``summary.json``)."""

    def __init__(self, data: dict[str, Any]):
        self.data = data

    @classmethod
    def of(cls, outcome: Outcome) -> Report:
        return cls(summary(outcome))

    @classmethod
    def of_run(cls, run: Any) -> Report:
        """The report of a :class:`~topo.launch.run.Run` that ended: what its records, teardown and parts saw."""
        life, wiring = run.life, run.wiring
        return cls.of(Outcome(
            run.state, life.error, run.options.command or {"argv": list(sys.argv), "cwd": os.getcwd()},
            wiring.engine.name, life.startup_timeout, life.shutdown_budget, life.max_concurrent_starts, life.ready_at,
            life.down, life.monitor.peak, life.monitor.seen, wiring.placement.describe() if wiring.placement else None,
            wiring.torchrl.to_dict(wiring.features), run.extra, evaluation=run.eval.describe() if run.eval else None,
            memory=run.state.memory(), actors=getattr(run.collector, "actor_placement", None),
            batches=run.digest.describe(), time_breakdown=_breakdown(run),
            nodes=getattr(run.collector, "node_reports", None)))

    @property
    def ok(self) -> bool:
        return self.data["ok"]

    def write(self, directory: str) -> str:
        """``directory/summary.json``, replaced whole (a reader never sees half of it)."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, "summary.json")
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w") as f:
            json.dump(self.data, f, indent=1)
            f.write("\n")
        os.replace(partial, path)
        return path

    def file(self, run_dir: str, report_dir: str | None) -> None:
        """Write the report to ``report_dir`` (the run directory is kept there, with its own copy: two runs
        given one ``report_dir`` each keep theirs, and ``report_dir/summary.json`` is the one that ended last);
        without one, keep the run directory with the report only when topo failed, and say where."""
        error = self.data["error"]
        removed = not report_dir and (error is None or error["in"] != "topo" or error["type"] == "Interrupted")
        if self.data.get("episodes"):
            self.data["episodes"]["kept"] = not removed
        if report_dir:
            self.write(run_dir)
            self.write(report_dir)
        elif removed:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            self.write(run_dir)
            print(f"topo: run directory kept: {run_dir}", file=sys.stderr)

    def __str__(self) -> str:
        return human(self.data)

    def __getitem__(self, key: str) -> Any:
        return self.data[key]


def summary(run: Outcome) -> dict[str, Any]:
    out = _summary(run)
    if run.nodes is not None:
        merge_nodes(out, run.nodes)
    return out


def merge_nodes(out: dict[str, Any], nodes: list[dict]) -> None:
    """Async mode on Ray (:mod:`topo.launch.ray.async_nodes`): what each node's run saw, in the trainer's report as
    one machine's run has it: its restarts and recycles (``node``: which node's run; their times are seconds since
    that run's launch), env constructions and closes, worker pids (in plan order), seeds, deaths and leftovers; and
    ``nodes``, a line per node run (``records``: its run directory, under the trainer's)."""
    p, pids = out["processes"], out["processes"]["worker_pids"]
    out["nodes"] = []
    for n in nodes:
        where = n["node"]
        node = (where.get("node_id") or "?")[:12]
        node_procs = n.get("processes") or {}
        out["nodes"].append({**where, "ok": n["ok"], "error": n.get("error"), "restarts": len(n.get("restarts") or []),
                             "env_closes": n.get("env_closes"), "alive_after": len(node_procs.get("alive_after") or [])})
        out["restarts"] += [{**r, "node": node} for r in n.get("restarts") or []]
        out["recycles"] += [{**r, "node": node} for r in n.get("recycles") or []]
        for row, pid in zip(n.get("rows") or [], node_procs.get("worker_pids") or []):
            pids[row] = pid
        for key in ("started", "deaths", "left_behind", "killed", "alive_after"):
            p[key] = p[key] + list(node_procs.get(key) or [])
        if n.get("constructions"):
            for role, count in n["constructions"]["by_role"].items():
                out["constructions"]["by_role"][role] += count
            out["constructions"]["expected"]["worker"] += n["constructions"]["expected"]["worker"]
        if n.get("env_closes"):
            for key in ("constructed", "closed"):
                out["env_closes"][key] += n["env_closes"][key]
        out["not_closed"] += n.get("not_closed") or []
        if n.get("seeds"):
            out["seeds"]["checked"] += n["seeds"]["checked"]
            out["seeds"]["mismatches"] += n["seeds"]["mismatches"]
        out["render_devices"] += n.get("render_devices") or []


def _summary(run: Outcome) -> dict[str, Any]:
    state, plan = run.state, run.state.plan
    down = run.teardown
    workers = list(state.workers.values())  # as the run ended: restarted subcollectors' current workers
    every = state.all_workers()  # and the ones their restarts replaced
    subs = [state.subcollectors[sub["index"]] for sub in plan["subcollectors"]]
    started = [s for s in state.all_subcollectors() if s.first or s.began]
    built = Counter(state.role_of(pid) for w in every for pid, _ in w.constructions)
    built.update(state.role_of(pid) for sub in state.all_subcollectors() for pid in sub.built_elsewhere)
    observed = {sub.index: sub.observed for sub in subs}
    batches = Counter()
    for s in state.all_subcollectors():
        batches[s.index] += (s.observed or {}).get("batches", 0)
    first_batch = min((r["first_time"] for r in observed.values() if r and r.get("first_time")), default=None)
    last_close = max((w.closed for w in workers if w.closed), default=None)
    server = state.server()
    return {
        "ok": run.error is None,
        "exit_code": _exit_code(run.error),
        "error": _error(run.error),
        "command": run.command,
        "run_dir": state.run.path,
        "topology": {"subcollectors": len(subs), "workers": len(workers),
                     "workers_per_subcollector": [s["num_workers"] for s in plan["subcollectors"]],
                     "sync": plan["collector"]["sync"], "start_methods": plan["start_methods"],
                     "engine": run.engine, "torchrl": (run.torchrl or {}).get("version")},
        "launch": {"startup_timeout_s": run.startup_timeout, "shutdown_budget_s": run.shutdown_budget,
                   "max_concurrent_starts": run.max_concurrent_starts,
                   "peak_concurrent_starts": _peak_concurrent(workers),
                   "restarts": plan["launch"].get("restarts") or {"max": 0, "window": None},
                   "hang_timeout_s": plan["launch"].get("hang_timeout"),
                   "batches_per_subcollector": [batches[sub.index] for sub in subs],
                   **run.extra},
        "constructions": {"by_role": {role: built.get(role, 0) for role in ROLES},
                          "expected": {"trainer": 0, "server": 0, "subcollector": 0,
                                       "worker": sum(_plan.subcollector(plan, s.index)["num_workers"] for s in started)}},
        "timings_s": {
            # the serial chain before any env worker can start: trainer, then each subcollector, import torchrl
            "subcollectors_up": (_since(state, max(s.up for s in subs)) if all(s.up for s in subs) else None),
            # every worker in its factory (process started, imports done), then every env built
            "workers_started": _since(state, _last([w.started for w in workers])),
            "workers_built": _since(state, _last([w.constructed for w in workers])),
            "all_ready": _since(state, run.ready_at),
            "first_batch": _since(state, first_batch),
            "worker_build": _stats([w.build_s for w in workers]),
            "shutdown": _delta(down.shutdown_at, down.shutdown_done),
            "worker_close": _stats([w.close_s for w in workers]),
            "first_to_last_close": _delta(down.shutdown_at, last_close),
            "teardown": _delta(down.started, down.finished),
            "total": _delta(state.t0, down.finished),
        },
        "processes": {
            "peak": run.peak,
            "trainer_pid": state.trainer_pid,
            "server_pid": server.pid if server else None,
            "subcollector_pids": [s.pid for s in subs],
            "subcollector_start_methods": [s.start_method for s in subs],
            "subcollector_exit_codes": down.exit_codes,
            "worker_pids": [w.pid for w in workers],
            "started": sorted(run.seen),
            "deaths": [{"pid": d.pid, "time": d.time, "how": d.how} for d in sorted(state.deaths.values(),
                                                                                    key=lambda d: d.time)],
            "left_behind": down.left_behind,
            "killed": sorted(set(down.killed)),
            "alive_after": down.alive_after,
            "watcher_exit_code": down.watcher_exit,
        },
        "env_closes": {"constructed": sum(len(w.constructions) for w in every),
                       "closed": sum(w.closes for w in every)},
        "not_closed": not_closed(state, down.killed),
        "first_batch": observe.check(plan, observed),
        "restarts": restarts(state),
        "recycles": recycles(state),
        "policy": run.policy,
        "torchrl": run.torchrl,
        "memory": memory(run.memory, state),
        "render_devices": _render_devices(workers),
        "inherited_gl": {"workers": sum(1 for w in workers if w.inherited_gl),
                         "libraries": sorted({lib for w in workers for lib in w.inherited_gl})},
        "seeds": {"checked": sum(1 for w in every if w.constructed),
                  "mismatches": [{"subcollector": w.subcollector, "worker": w.index, "restart": w.restart,
                                  "planned": w.row["seed"], "applied": w.seed}
                                 for w in every if w.constructed and w.seed != w.row["seed"]]},
        "evaluation": run.evaluation,
        "episodes": episodes.counts(state.run.path),
        "steps": steps(state),
        "actors": run.actors,
        "batches": run.batches,
        "time_breakdown": run.time_breakdown,
        "plan": plan,
    }


def steps(state) -> dict[str, Any]:
    """Decisions (the policy's steps of each worker) and env steps, each counted where it ran (the beats files of
    every subcollector life: :func:`topo.runtime.heartbeat.steps`): under ``MultiAction`` up to a chunk of env
    steps per decision, fewer when an episode ends mid-chunk; and the plan's ``env.transforms`` with where they
    were built (``by_role``: one per stack built)."""
    env = state.plan["env"]
    at_subcollector = env.get("transforms_at") == "subcollector"
    decisions = env_steps = 0
    for sub in state.plan["subcollectors"]:
        for restart in sorted({s.restart for s in state.all_subcollectors() if s.index == sub["index"]}):
            found = heartbeat.steps(state.run.path, sub["index"], restart)
            if found is not None:
                taken, counted = found
                env_steps += sum(counted[1:])
                decisions += counted[0] if at_subcollector else sum(taken[1:])
    built = Counter(state.role_of(pid) for pid in state.stacks)
    return {"decisions": decisions, "env_steps": env_steps,
            "transforms": [t["name"] for t in env.get("transforms") or []], "transforms_at": env.get("transforms_at", "worker") if env.get("transforms") else None,
            "transforms_built": {role: built.get(role, 0) for role in ROLES}}


def human_steps(s: dict | None) -> str:
    """The report's line on decisions and env steps (``steps`` of :func:`summary`)."""
    if not s:
        return "  steps: not counted"
    line = f"  steps: {s['decisions']} decisions, {s['env_steps']} env steps"
    if s["transforms"]:
        built = ", ".join(f"{role} {n}" for role, n in s["transforms_built"].items())
        line += f"; transforms {', '.join(s['transforms'])} at {s['transforms_at']} (built: {built})"
    return line


def restarts(state) -> list[dict[str, Any]]:
    """Each restart: its cause (and the failed worker's plan row, its kwargs aside), its times (seconds since launch; ``recover_s``: from the failure to the
    restarted subcollector's first batch), the processes it replaced and started, the seeds they applied."""
    out = []
    for r in state.restarts:
        new, first = _start_of(state, r)
        died = r.cause.at if r.cause.at is not None else r.decided_at
        out.append({
            "subcollector": r.subcollector, "restart": r.restart, "outcome": new.pop("outcome"),
            "cause": r.cause.to_dict(),
            "row": {k: v for k, v in r.cause.row.items() if k != "kwargs"} if r.cause.row else None,
            "failed_s": _since(state, died), "decided_s": _since(state, r.decided_at), **new,
            "recover_s": _delta(died, first),
        })
    return out


def recycles(state) -> list[dict[str, Any]]:
    """Each recycle (``launch.recycle``): the worker past its budget (the budget, its value, the limit, its plan
    row), its times as for a restart (``rebuild_s``: from the decision to the rebuilt subcollector being ready)
    and the processes it replaced and started, the seeds they applied."""
    out = []
    for r in state.recycles:
        new, _ = _start_of(state, r)
        out.append({
            "subcollector": r.subcollector, "restart": r.restart, "outcome": new.pop("outcome"),
            "breach": r.breach.to_dict(), "reason": r.breach.describe(),
            "row": {k: v for k, v in r.row.items() if k != "kwargs"},
            "decided_s": _since(state, r.decided_at), **new, "rebuild_s": _delta(r.decided_at, r.ready_at),
        })
    return out


def _start_of(state, r) -> tuple[dict[str, Any], float | None]:
    """What a restart or recycle ``r`` started: its outcome, times, the pids it replaced and started, seeds,
    its first batch checked; and the time of that first batch."""
    c, k = r.subcollector, r.restart
    old, new = state.subcollector(c, k - 1), state.subcollector(c, k)
    rows = _plan.subcollector(state.plan, c)["workers"]
    new_workers = [state.worker(c, row["index"], k) for row in rows]
    old_workers = [state.worker(c, row["index"], k - 1) for row in rows]
    observed = new.observed if new else None
    first = (observed or {}).get("first_time")
    return {
        "outcome": "superseded" if r.superseded else "collecting" if first else "ready" if r.ready_at
        else "starting" if r.began_at else "pending",
        "began_s": _since(state, r.began_at), "ready_s": _since(state, r.ready_at),
        "first_batch_s": _since(state, first),
        "replaced": {"subcollector": old.pid if old else None, "workers": [w.pid if w else None for w in old_workers]},
        "started": {"subcollector": new.pid if new else None, "workers": [w.pid if w else None for w in new_workers]},
        "seeds": {"planned": [w.row["seed"] if w else None for w in new_workers],
                  "applied": [w.seed if w else None for w in new_workers]},
        "first_batch": observe.check({"subcollectors": [_plan.subcollector(state.plan, c)]}, {c: observed})[0],
    }, first


def memory(rows: list[dict], state) -> dict[str, Any]:
    """Each worker's resident memory as the run ended (MB; ``at_s``: when the worker last read it, seconds since
    launch), and min/median/max over the workers of their peaks (``peak_rss_mb``) and current figures."""
    workers = [{k: v for k, v in r.items() if k != "at"} | {"at_s": _since(state, r["at"])} for r in rows]
    return {"measured": sum(1 for r in rows if r["peak_rss_mb"] is not None), "workers_total": len(rows),
            "peak_rss_mb": _spread([r["peak_rss_mb"] for r in rows]), "rss_mb": _spread([r["rss_mb"] for r in rows]),
            "workers": workers}


def _exit_code(error: BaseException | None) -> int:
    if error is None:
        return 0
    return error.exit_code if isinstance(error, TopoError) else 1


def _error(error: BaseException | None) -> dict | None:
    if error is None:
        return None
    failure = getattr(error, "failure", None)
    return {
        "type": type(error).__name__, "message": str(error),
        "formatted": error.format() if isinstance(error, TopoError) else f"{type(error).__name__}: {error}",
        "in": "topo" if isinstance(error, TopoError) else "training loop",
        "subcollector": getattr(error, "subcollector", None), "worker": getattr(error, "worker", None),
        "failure": failure.to_dict() if failure is not None else None,
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


def _spread(values: list) -> dict | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return {"min": values[0], "median": round(statistics.median(values), 1), "max": values[-1]}


def _since(state, t: float | None) -> float | None:
    return None if t is None else round(t - state.t0, 3)


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 3)


def _stats(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"min": round(min(values), 3), "mean": round(sum(values) / len(values), 3), "max": round(max(values), 3)}


def not_closed(state, killed: list[int]) -> list[dict]:
    """Each env built and never closed, with why: it died or hung (the failure that retired its start names it,
    as a Ray actor names its workers, or its death was seen first); its subcollector's start was retired and
    that ended it (a restart or a recycle kills the old start's workers); the teardown killed it; or no record
    says."""
    ended = {(r.subcollector, r.restart - 1): r for r in (*state.restarts, *state.recycles)}  # the start each retired
    retired = {id(w) for w in state.retired_workers}
    out = []
    for w in state.all_workers():
        if not w.constructions or w.closes:
            continue
        by = ended.get((w.subcollector, w.restart)) if id(w) in retired else None
        cause = getattr(by, "cause", None)  # a recycle has none: a budget, not a failure
        if cause is not None and cause.kind in ("worker-died", "worker-hung") and cause.worker == w.index:
            why = f"{'hung' if cause.kind == 'worker-hung' else 'died'} ({cause.how or 'unknown'})"
        elif w.died and (by is None or w.died.time < by.decided_at):
            why = f"died ({w.died.how or 'unknown'})"
        elif by is not None:
            why = f"ended by its subcollector's {'restart' if cause is not None else 'recycle'}"
        else:
            why = "killed at teardown" if w.local and w.pid in killed else "no close record"  # killed: pids of this host
        out.append({"subcollector": w.subcollector, "worker": w.index, "restart": w.restart, "pid": w.pid, "why": why})
    return out


def _why_not_closed(items: list[dict] | None) -> str:
    """`` (not closed: 1 died (killed by SIGKILL), 1 ended by its subcollector's restart)``, or nothing."""
    if not items:
        return ""
    counts = Counter(item["why"] for item in items)
    return " (not closed: " + ", ".join(f"{n} {why}" for why, n in counts.items()) + ")"


def human(s: dict) -> str:
    """A few lines: outcome, constructions per role, timings, closes, leftovers, first-batch check, policy."""
    t, p, c = s["timings_s"], s["processes"], s["constructions"]["by_role"]
    topo = s["topology"]
    error = s["error"]
    outcome = "ok" if s["ok"] else "interrupted" if error["type"] == "Interrupted" else \
        "FAILED" if error["in"] == "topo" else f"ended by the training loop's {error['type']}"
    launch = s["launch"]
    batches = f", {launch['batches_collected']}/{launch['batches_requested']} batch(es)" \
        if "batches_requested" in launch else f", batches per subcollector {launch['batches_per_subcollector']}"
    lines = [
        f"run {outcome}: {topo['subcollectors']} subcollector(s), {topo['workers']} env workers{batches}"
        + (f" (torchrl {topo['torchrl']})" if topo.get("torchrl") else ""),
        "  env constructions: " + ", ".join(f"{role} {c[role]}" for role in ROLES)
        + f" (expected worker {s['constructions']['expected']['worker']}, others 0)",
        f"  all ready {_fmt(t['all_ready'])}, first batch {_fmt(t['first_batch'])}, "
        f"shutdown {_fmt(t['shutdown'])} (budget {launch['shutdown_budget_s']:g}s)",
        f"  env closes {s['env_closes']['closed']}/{s['env_closes']['constructed']}{_why_not_closed(s.get('not_closed'))}"
        f", subcollector exit codes "
        f"{p['subcollector_exit_codes']}, peak processes {p['peak']}",
        f"  left behind {len(p['left_behind'])}, alive after {len(p['alive_after'])}",
        human_memory(s.get("memory")),
        human_steps(s.get("steps")),
        human_episodes(s.get("episodes"), s.get("run_dir")),
    ]
    digest = s.get("batches")
    if digest and digest["count"]:
        lines.append(f"  batches digest: sha256 {digest['sha256']} over {digest['count']} batch(es), "
                     f"{digest['ms_per_batch']:.2f} ms per batch")
    lines += [f"  WARNING: {warning}" for warning in (s.get("torchrl") or {}).get("warnings", [])]
    policy = s.get("policy")
    if policy:
        lines.append(f"  policy {policy['factory']} " + _acting(policy, [e.get("policy_versions") for e in s["first_batch"]]))
    lines += time_breakdown.human(s.get("time_breakdown"))
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
    for n in s.get("nodes") or []:
        closes = n.get("env_closes") or {}
        lines.append(f"  node {(n.get('node_id') or '?')[:12]} ({n.get('hostname')}), subcollectors {n['subcollectors']}: "
                     + ("ok" if n["ok"] else f"FAILED ({(n.get('error') or {}).get('message')})")
                     + f", restarts {n['restarts']}, env closes {closes.get('closed')}/{closes.get('constructed')}, "
                     f"alive after {n['alive_after']}, records {n.get('records')}")
    for r in s.get("restarts") or []:
        cause = r["cause"]
        who = f"sub{r['subcollector']}" + (f"/w{cause['worker']}" if cause.get("worker") is not None else "")
        after = f"first batch {r['recover_s']:.1f}s after" if r["recover_s"] is not None else f"{r['outcome']}"
        on = f" on node {r['node']}" if r.get("node") else ""
        lines.append(f"  restart {r['restart']} of sub{r['subcollector']}{on} at {_fmt(r['failed_s'])}: {who} {cause['kind']} "
                     f"({cause.get('how') or cause['message']}); {after}; pids {r['started']['subcollector']} "
                     f"{r['started']['workers']}, seeds {r['seeds']['applied']}")
    lines += [recycle_line(r) for r in s.get("recycles") or []]
    lines += _evaluation(s.get("evaluation"))
    if s.get("actors"):
        lines.append("  actors, planned -> actual:")
        lines += describe_placement(s["actors"] + ([s["policy"]["server"]] if (s.get("policy") or {}).get("server")
                                                       else []))
    checks = Counter(entry["status"] for entry in s["first_batch"])
    lines.append("  first batch vs plan: " + ", ".join(f"{n} {status}" for status, n in sorted(checks.items()))
                 + (f"; seeds: {len(s['seeds']['mismatches'])} mismatch(es) of {s['seeds']['checked']}"))
    for entry in s["first_batch"]:
        seen = entry.get("instructions") or []
        if seen:
            groups = entry.get("groups") or []
            suites = [t for t in entry.get("tasks") or [] if isinstance(t, str)]  # "suite:id": name them
            lines.append(f"    sub{entry['subcollector']} [{entry['status']}] "
                         + (f"tasks {ids_text(suites)}, " if suites else "") + f"groups {groups}: "
                         + "; ".join(repr(text) for text in seen))
    return "\n".join(lines)


def recycle_line(r: dict) -> str:
    """``recycled subcollector 0 (worker 1, plan row seed 101 task 0: rss 1.90 GB > max_rss_gb 1.5) in 6.2 s``."""
    row = r["row"]
    where = " ".join(f"{key} {row[key]}" for key in ("global_index", "seed", "task_id") if row.get(key) is not None)
    took = f"in {r['rebuild_s']:.1f} s" if r["rebuild_s"] is not None else r["outcome"]
    return (f"  recycled subcollector {r['subcollector']} (worker {r['breach']['worker']}, plan row {where}: "
            f"{r['reason']}) {took}; pids {r['started']['subcollector']} {r['started']['workers']}, "
            f"seeds {r['seeds']['applied']}")


def _evaluation(section: dict | None) -> list[str]:
    """The eval process's lines: its rounds (the last one's figures) and its own run's proof."""
    if not section:
        return []
    rounds, collector = section["rounds"], section.get("collector") or {}
    if rounds:
        last = rounds[-1]
        head = (f"  evaluation: {len(rounds)} round(s), {section['skipped']} skipped; last: {last['successes']}/"
                f"{last['episodes']} succeeded ({100 * (last['success_rate'] or 0):.1f}%) with policy version "
                f"{last['policy_version']}")
    else:
        head = f"  evaluation: no round ended, {section['skipped']} skipped"
    lines = [head] + [f"    suite {x['suite']}: {x['successes']}/{x['episodes']} succeeded "
                      f"({100 * (x['success_rate'] or 0):.1f}%) over {x['tasks']} task(s)"
                      for x in (rounds[-1].get("suites") or [] if rounds else [])]
    if collector:
        built = collector["constructions"]["by_role"]
        lines.append(f"    eval workers: {collector['topology']['workers']}, env constructions "
                     + ", ".join(f"{role} {built[role]}" for role in ROLES)
                     + f", env closes {collector['env_closes']['closed']}/{collector['env_closes']['constructed']}, "
                     f"left behind {len(collector['processes']['left_behind'])}, alive after "
                     f"{len(collector['processes']['alive_after'])}" + ("" if collector["ok"] else ", FAILED"))
    return lines


def human_episodes(e: dict | None, run_dir: str | None) -> str:
    """The report's line on episode provenance (``episodes`` of :func:`summary`)."""
    if not e or not e["recorded"]:
        return "  episodes recorded: 0"
    how = "with their actions (topo replay)" if e["actions"] else "without actions (launch.record_actions: false)"
    lives = f"{e['worker_lives']} worker li{'fe' if e['worker_lives'] == 1 else 'ves'}"
    where = f"topo runs show {run_dir}" if e.get("kept", True) else "not kept (keep a run with --report DIR)"
    return f"  episodes recorded: {e['recorded']} over {lives}, {how}: {where}"


def human_memory(m: dict | None) -> str:
    """The report's line on memory: the spread of the workers' peaks (``memory`` of :func:`summary`)."""
    peak = (m or {}).get("peak_rss_mb")
    if not peak:
        return "  memory per worker: not measured (no env worker built, none on this host, or no /proc)"
    return (f"  memory per worker, peak RSS: min {peak['min']:.0f} / median {peak['median']:.0f} / max {peak['max']:.0f} MB "
            f"({m['measured']} of {m['workers_total']} worker(s) measured)")


def _acting(policy: dict, versions: list) -> str:
    """Where the policy acted and which weights: e.g. ``in each subcollector, weights by shared_mem: 3 update(s)...``."""
    where = "on one inference server" if policy["placement"] == "server" else "in each subcollector"
    served = (policy.get("server") or {}).get("actual")
    if served:
        where += f" (a Ray actor, pid {served['pid']} on {served['hostname']}, node {served['node_id'][:12]})"
    if not policy["trainer_policy"]:
        return f"{where}, with the factory's weights (no trainer policy to push)"
    how = "" if policy["placement"] == "server" else f", weights by {policy['weight_sync']}"
    return f"{where}{how}: {policy['updates']} update(s); versions in each subcollector's last batch {versions}"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _breakdown(run: Any) -> dict | None:
    """The run's time breakdown for its report; what kept it from being read, when something did (a report is
    written whatever happened)."""
    try:
        return run.time_breakdown()
    except Exception as exc:  # noqa: BLE001 - the report says why instead
        return {"verdict": None, "line": f"not measured: {type(exc).__name__}: {exc}"}
