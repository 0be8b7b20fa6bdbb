"""Render plans and diagnostics for people (tables) and machines (JSON, YAML)."""
from __future__ import annotations

import json
from typing import Any, Iterable

from topo.diagnostics import Diagnostic, ids_text
from topo.compiler.plan import dumps, engine
from topo.compiler.planfile import seal

COLUMNS = (("w", "index"), ("g", "global_index"), ("task", "task_id"), ("group_id_offset", "group_id_offset"),
           ("seed", "seed"), ("init", "init"), ("gpu", "render_gpu"), ("instruction", "instruction"))


def plan_text(plan: dict[str, Any], fmt: str = "table", limit: int | None = None, width: int = 120) -> str:
    if fmt == "json":
        return dumps(plan)
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(seal(plan), sort_keys=False, allow_unicode=True, width=1000)
    text = table(plan, limit, width) + "\n" + coverage_text(plan)
    if plan.get("eval"):
        text += "\n" + eval_table(plan, limit, width) + "\n" + eval_coverage_text(plan, width)
    return text


def _cell(row: dict, key: str) -> str:
    if key == "init":
        return f"{row['init_state_mode']}:{row['init_state_id']}"
    value = row[key]
    return "-" if value is None else str(value)


def table(plan: dict[str, Any], limit: int | None = None, width: int = 120) -> str:
    start = plan["start_methods"]
    lines = [
        f"plan {plan['name']!r}: {plan['coverage']['subcollectors']} subcollector(s), {plan['coverage']['workers']} "
        f"workers, backend {plan['env']['backend']}, start {start['subcollectors']}/{start['workers']}, "
        f"spec sha256 {plan['spec']['sha256'][:12]}",
    ]
    if plan["collector"].get("mode") == "async":
        lines.append(f"collector: async, one AsyncBatchedCollector over all {plan['coverage']['workers']} workers (no "
                     f"barrier), {plan['collector']['frames_per_batch']} frames per batch, the policy in one inference "
                     "server process that the env workers reach through shared-memory slots")
    policy = plan.get("policy")
    if policy:
        where = "one inference server" if policy["placement"] == "server" or plan["collector"].get("mode") == "async" \
            else f"each subcollector, weights by {policy['weight_sync']}"
        lines.append(f"policy {policy['factory']}({_kwargs(policy['kwargs'])}) in {where}, device {policy['device'] or 'cpu'}")
    if plan["env"].get("transforms"):
        lines.append(transforms_text(plan["env"]))
    recycle = plan["launch"].get("recycle")
    if recycle:
        lines.append(recycle_text(recycle))
    for sub in plan["subcollectors"]:
        workers = sub["workers"]
        shown = workers if limit is None else workers[:limit]
        cells = [[_cell(r, key) for _, key in COLUMNS] for r in shown]
        widths = [max([len(title)] + [len(c[i]) for c in cells]) for i, (title, _) in enumerate(COLUMNS[:-1])]
        room = max(width - sum(widths) - 2 * len(widths), 16)
        gpu = "-" if sub["render_gpu"] is None else f"{sub['render_gpu']} ({plan['render']['numbering']})"
        lines.append("")
        lines.append(f"subcollector {sub['index']}: {sub['num_workers']} workers, render gpu {gpu}"
                     + _placed(plan, sub["index"]))
        lines += _table([title for title, _ in COLUMNS[:-1]] + ["instruction"], cells, widths, room,
                        len(workers) - len(shown))
    return "\n".join(lines) + "\n"


def transforms_text(env: dict[str, Any]) -> str:
    """The dry-run's line on the stack: ``transforms (in each worker): MultiAction(stack_rewards=False) -> ...``."""
    where = "in each worker" if env["transforms_at"] == "worker" else "over each subcollector's ParallelEnv"
    return f"transforms ({where}): " + " -> ".join(f"{t['name']}({_kwargs(t['kwargs'])})" for t in env["transforms"])


def recycle_text(recycle: dict[str, Any]) -> str:
    """The dry-run's line on health budgets: ``recycle a subcollector when a worker's rss > 1.5 GB (...)``."""
    budgets = [f"rss > {recycle['max_rss_gb']:g} GB" if recycle["max_rss_gb"] is not None else None,
               f"step latency > {recycle['max_latency_drift']:g} x its baseline"
               if recycle["max_latency_drift"] is not None else None,
               f"episodes > {recycle['max_episodes']}" if recycle["max_episodes"] is not None else None]
    every = "every batch" if recycle["check_every"] == 1 else f"every {recycle['check_every']} batches"
    named = [b for b in budgets if b]
    return (f"recycle a subcollector when a worker's {' or '.join(named)} (checked {every}; restart seeds)"
            if named else "recycle: no budget (never)")


def _table(titles: list[str], cells: list[list[str]], widths: list[int], room: int, more: int) -> list[str]:
    """Right-aligned columns of ``widths``, the last one (free text) cut to ``room``; ``more`` rows not shown."""
    lines = ["  ".join([title.rjust(widths[i]) for i, title in enumerate(titles[:-1])] + [titles[-1]]).rstrip()]
    for c in cells:
        text = c[-1] if len(c[-1]) <= room else c[-1][: room - 3] + "..."
        lines.append("  ".join([c[i].rjust(widths[i]) for i in range(len(widths))] + [text]).rstrip())
    if more:
        lines.append(f"  ... {more} more worker(s)")
    return lines


def _kwargs(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _placed(plan: dict[str, Any], c: int) -> str:
    if engine(plan) == "local":
        return ""
    placement = plan["placement"]
    return ", " + _actor(placement["subcollectors"][c])


def _actor(entry: dict[str, Any]) -> str:
    """A Ray actor of the plan: 'ray actor (1 cpus, 0 gpus, node_b 1) -> gpu#0'."""
    r = entry["resources"]
    ask = f"{r['cpus']:g} cpus, {r['gpus']:g} gpus"
    if r["memory_gb"] is not None:
        ask += f", {r['memory_gb']:g} GB"
    ask += "".join(f", {k} {v:g}" for k, v in r["custom"].items())
    return f"ray actor ({ask})" + (f" -> {entry['node']}" if entry["node"] else "")


def coverage_text(plan: dict[str, Any]) -> str:
    cov = plan["coverage"]
    lines = ["coverage:"]
    tasks = [t for t in cov["tasks"] if t["task_id"] is not None]
    if tasks:
        counts = sorted({t["workers"] for t in tasks})
        lines.append(f"  tasks: {len(tasks)}, workers per task {'/'.join(map(str, counts))}"
                     + (" (even)" if len(counts) == 1 else " (uneven)"))
        lines.append("    " + ", ".join(f"{t['task_id']}:{t['workers']}" for t in tasks))
    ipc = cov["instructions_per_subcollector"]
    lines.append(f"  distinct instructions per subcollector: {_runs(ipc)}")
    g = cov["groups"]
    state = "all complete" if not g["incomplete"] else f"{len(g['incomplete'])} INCOMPLETE: {g['incomplete'][:10]}"
    lines.append(f"  groups: {g['count']} of {g['workers_per_group']} worker(s) each, {state}")
    gpus = ", ".join(f"{'cpu' if r['render_gpu'] is None else 'gpu ' + str(r['render_gpu'])}: {r['workers']}"
                     for r in cov["render_gpus"])
    placement = plan.get("placement") or {}
    lines.append(f"  workers per render device{_numbering(plan)}: {gpus}")
    if placement.get("engine") == "ray":
        nodes = sorted({e["node"] for e in placement["subcollectors"] if e["node"]})
        lines.append(f"  placement: ray at {placement['address']}, {len(placement['subcollectors'])} actor(s)"
                     + (f" on {len(nodes)} node(s)" if nodes else ""))
        if placement.get("server"):
            lines.append(f"  inference server: {_actor(placement['server'])}")
    return "\n".join(lines) + "\n"


def _numbering(plan: dict[str, Any]) -> str:
    """How the render device ids count: ' (egl indices, device-zero fallback)', or '' when none is named."""
    render = plan.get("render")
    if not render:
        return ""
    notes = [f"{render['numbering']} indices"]
    if render["device_zero_fallback"]:
        notes.append("device-zero fallback")
    if engine(plan) == "ray" and render["numbering"] == "cuda":
        notes.append("actor-local")
    return f" ({', '.join(notes)})"


def _runs(values: list[int]) -> str:
    if len(set(values)) == 1:
        return f"{values[0]} in each of {len(values)}"
    return ", ".join(map(str, values))


EVAL_COLUMNS = ("w", "g", "episodes", "first..last", "seeds")  # seeds: first..last of an offset stream


def eval_table(plan: dict[str, Any], limit: int | None = None, width: int = 120) -> str:
    """The eval workers: one line each with its episodes (how many, which, their seeds) and tasks."""
    ev = plan["eval"]
    cov = ev["coverage"]
    when = f"every {ev['every']} training iteration(s)" if ev["every"] else "when the script calls run.evaluate()"
    steps = f"at most {ev['max_episode_steps']} steps" if ev["max_episode_steps"] else "the env's own horizon"
    lines = [
        f"eval: {cov['episodes']} episode(s) per evaluation ({_how_many(ev)}) over {cov['workers']} worker(s) in "
        f"{len(ev['subcollectors'])} subcollector(s)",
        f"  {when}, {'in the background' if ev['async'] else 'blocking'} (busy: {ev['busy_policy']})",
        f"  episodes: {steps}, exploration {ev['exploration']}, policy {ev['policy']}, seeds "
        f"{ev['seeds']['strategy']} from {ev['seeds']['base']}",
    ]
    columns = EVAL_COLUMNS if ev["seeds"]["strategy"] == "offset" else EVAL_COLUMNS[:-1]
    for sub in ev["subcollectors"]:
        workers = sub["workers"]
        shown = workers if limit is None else workers[:limit]
        cells = [[str(r["index"]), str(r["global_index"]), str(len(r["episodes"])),
                  f"{r['episodes'][0]['episode']}..{r['episodes'][-1]['episode']}",
                  f"{r['episodes'][0]['seed']}..{r['episodes'][-1]['seed']}"][:len(columns)]
                 + ["-" if r["tasks"] == [None] else ids_text(r["tasks"])] for r in shown]
        widths = [max([len(title)] + [len(c[i]) for c in cells]) for i, title in enumerate(columns)]
        room = max(width - sum(widths) - 2 * len(widths), 16)
        gpu = "-" if sub["render_gpu"] is None else f"{sub['render_gpu']} ({workers[0]['render_numbering']})"
        lines.append("")
        lines.append(f"eval subcollector {sub['index']}: {sub['num_workers']} workers, render gpu {gpu}")
        lines += _table(list(columns) + ["tasks"], cells, widths, room, len(workers) - len(shown))
    return "\n".join(lines) + "\n"


def _how_many(ev: dict[str, Any]) -> str:
    """``2 tasks x 50 init states x 1 trial``, or ``75 (task, init state) pairs x 2 trials``."""
    trials = f"{ev['trials']} trial{'s' if ev['trials'] != 1 else ''}"
    tasks = ev["coverage"]["tasks"]
    counts = {t["init_states"] for t in tasks}
    if counts == {None}:
        return trials if tasks[0]["task_id"] is None else f"{len(tasks)} task{'s' if len(tasks) != 1 else ''} x {trials}"
    if len(counts) == 1:
        (n,) = counts
        return f"{len(tasks)} task{'s' if len(tasks) != 1 else ''} x {n} init state{'s' if n != 1 else ''} x {trials}"
    return f"{sum(t['init_states'] or 1 for t in tasks)} (task, init state) pairs over {len(tasks)} tasks x {trials}"


def eval_coverage_text(plan: dict[str, Any], width: int = 120) -> str:
    """Episodes per task (held-out marked) and per worker, uneven splits said plainly."""
    ev = plan["eval"]
    cov = ev["coverage"]
    lines = ["eval coverage:"]
    tasks = cov["tasks"]
    counts = sorted({t["episodes"] for t in tasks})
    held = sum(t["held_out"] for t in tasks)
    if tasks[0]["task_id"] is not None:
        lines.append(f"  tasks: {len(tasks)} ({held} held out), episodes per task {'/'.join(map(str, counts))}"
                     + (" (even)" if len(counts) == 1 else " (uneven: tasks have different init state counts)"))
    for t in tasks:
        states = "" if t["init_states"] is None else \
            f"{t['init_states']} init state{'s' if t['init_states'] != 1 else ''} x "
        head = (f"    {'-' if t['task_id'] is None else t['task_id']}: {t['episodes']} episode(s) ({states}"
                f"{ev['trials']} trial{'s' if ev['trials'] != 1 else ''})" + (", held out" if t["held_out"] else ""))
        text = f"{head}: {t['instruction']}" if t["instruction"] is not None else head
        lines.append(text if len(text) <= width else text[: width - 3] + "...")
    per = [w["episodes"] for w in cov["per_worker"]]
    n, total = len(per), cov["episodes"]
    if len(set(per)) == 1:
        lines.append(f"  episodes per worker: {per[0]} in each of {n}")
    else:
        more = sum(1 for p in per if p == per[0])
        lines.append(f"  episodes per worker: {per[0]} for {_workers(0, more - 1)}, {per[-1]} for "
                     f"{_workers(more, n - 1)}")
        lines.append(f"    (uneven: {total} episodes over {n} workers, {total} % {n} = {more} get one more; each "
                     f"(task, init state) still runs exactly {ev['trials']} time{'s' if ev['trials'] != 1 else ''})")
    return "\n".join(lines) + "\n"


def _workers(lo: int, hi: int) -> str:
    return f"worker {lo}" if lo == hi else f"workers {lo}-{hi}"


def diagnostics_text(diagnostics: Iterable[Diagnostic]) -> str:
    diagnostics = list(diagnostics)
    errors = sum(d.is_error for d in diagnostics)
    warnings = len(diagnostics) - errors
    if not diagnostics:
        return ""
    body = "\n".join(d.format() for d in diagnostics)
    summary = f"{errors} error(s), {warnings} warning(s)"
    return (body + "\n" if body else "") + summary + "\n"


def diagnostics_json(diagnostics: Iterable[Diagnostic], ok: bool) -> str:
    items = [d.to_dict() for d in diagnostics]
    return json.dumps({"ok": ok, "diagnostics": items}, indent=1) + "\n"
