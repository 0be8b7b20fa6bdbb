"""An evaluation round's results: per task and overall, with Wilson intervals; as JSON, a table and a plot.

Pure (no torch): the figures come from the episodes :func:`topo.launch.evaluate.finished` read.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from topo.diagnostics import ids_text, task_order

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> list[float] | None:
    """The Wilson score interval of a success rate (95 % by default); None without episodes."""
    if n == 0:
        return None
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [round(max(0.0, centre - half), 4), round(min(1.0, centre + half), 4)]


def summarise(section: dict[str, Any], planned: dict[int, tuple], ended: dict[int, dict], *, round_: int,
              step: int | None, version: int | None, acting_version: int, seconds: float) -> dict[str, Any]:
    """The result of one round: ``planned`` maps episode -> (subcollector, worker, plan episode), ``ended``
    episode -> what its last step showed."""
    held_out = set(section.get("held_out") or [])
    episodes, tasks = [], {}
    for number in sorted(planned):
        sub, worker, plan_episode = planned[number]
        seen = ended.get(number)
        row = {**{k: plan_episode.get(k) for k in ("episode", "task_id", "init_state_id", "trial", "seed")},
               "subcollector": sub, "worker": worker, "ended": seen is not None,
               **({k: seen.get(k) for k in ("init_state_applied", "success", "length", "return", "checksum",
                                           "acting_version", "episode_id")}
                  if seen else {})}
        episodes.append(row)
        task = tasks.setdefault(plan_episode.get("task_id"), {
            "task_id": plan_episode.get("task_id"), "instruction": plan_episode.get("instruction"),
            "held_out": plan_episode.get("task_id") in held_out, "episodes": 0, "successes": 0, "lengths": []})
        if seen:
            task["episodes"] += 1
            task["successes"] += int(seen["success"])
            task["lengths"].append(seen["length"])
    per_task = [_rates(t) for t in tasks.values()]
    done = [e for e in episodes if e["ended"]]
    wrong = sorted(e["episode"] for e in done if e["acting_version"] not in (None, acting_version))
    # the init state the env says it started from, where it says one, against the plan's
    moved = sorted(e["episode"] for e in done if e["init_state_applied"] is not None
                   and e["init_state_applied"] != e["init_state_id"])
    overall = _rates({"episodes": len(done), "successes": sum(e["success"] for e in done),
                      "lengths": [e["length"] for e in done]})
    suites = _suites(per_task)
    return {"round": round_, "step": step, "policy_version": version, "acting_version": acting_version,
            "seconds": round(seconds, 3), "planned": len(planned), **overall,
            "held_out": sorted(held_out, key=task_order), "tasks": per_task, **suites,
            **({"protocol": section["protocol"]} if section.get("protocol") else {}),
            **lerobot(per_task, suites.get("suites", []), overall, seconds),
            **({"robustness": robustness(section["variants"], episodes)} if section.get("variants") else {}),
            "other_weights": wrong, "other_init_states": moved, "episodes_detail": episodes}


def robustness(variants: dict[str, str], episodes: list[dict]) -> list[dict[str, Any]]:
    """Each perturbed suite against the suite it perturbs, paired by (task id, init state, trial): both rates, the
    drop (the suite's rate less the variant's) with its interval, the discordant pairs, the exact McNemar p
    (:func:`.paired.compare`)."""
    from topo.launch.evaluation.paired import compare

    ended = {(e["task_id"], e["init_state_id"], e["trial"]): e for e in episodes if e["ended"]}
    out = []
    for variant, base in variants.items():
        pairs = [(ended[(f"{base}:{task.partition(':')[2]}", state, trial)], e)
                 for (task, state, trial), e in ended.items() if task.partition(":")[0] == variant
                 and (f"{base}:{task.partition(':')[2]}", state, trial) in ended]
        c = compare([bool(a["success"]) for a, _ in pairs], [bool(b["success"]) for _, b in pairs])
        out.append({"suite": base, "variant": variant, "pairs": c["pairs"], "suite_rate": c["rate_a"],
                    "variant_rate": c["rate_b"], "drop": c["difference"], "ci95": c["ci95"],
                    "discordant": {"suite_only": c["discordant"]["a_only"], "variant_only": c["discordant"]["b_only"]},
                    "mcnemar_p": c["mcnemar_p"]})
    return out


def lerobot(per_task: list[dict], suites: list[dict], overall: dict, seconds: float) -> dict[str, Any]:
    """The round as ``lerobot-eval`` shapes its results (``per_task``, ``per_group``, ``overall``; success in
    percent), with topo's counts and 95 % intervals beside."""
    def figures(t: dict) -> dict:
        return {"n_episodes": t["episodes"], "successes": t["successes"],
                "pc_success": None if t["success_rate"] is None else round(100 * t["success_rate"], 2),
                "ci95_pc": None if t["ci95"] is None else [round(100 * x, 2) for x in t["ci95"]]}

    tasks = [{"task_group": t["task_id"].partition(":")[0] if isinstance(t["task_id"], str) else None,
              "task_id": int(t["task_id"].partition(":")[2]) if isinstance(t["task_id"], str) else t["task_id"],
              "metrics": figures(t)} for t in per_task]
    return {"per_task": tasks, "per_group": {g["suite"]: figures(g) for g in suites},
            "overall": {**figures(overall), "eval_s": round(seconds, 3)}}


def _suites(per_task: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"suites": [...]}``: each suite's rates, where the task ids name suites (``"libero_goal:0"``); {} otherwise."""
    by_suite: dict[str, list[dict]] = {}
    for t in per_task:
        if isinstance(t["task_id"], str):
            by_suite.setdefault(t["task_id"].partition(":")[0], []).append(t)
    return {"suites": [_rates({"suite": name, "tasks": len(ts), "episodes": sum(t["episodes"] for t in ts),
                               "successes": sum(t["successes"] for t in ts),
                               "lengths": [t["mean_length"] for t in ts for _ in range(t["episodes"])
                                           if t["mean_length"] is not None]})
                       for name, ts in by_suite.items()]} if by_suite else {}


def _rates(t: dict[str, Any]) -> dict[str, Any]:
    n, k, lengths = t["episodes"], t["successes"], t.pop("lengths")
    return {**t, "success_rate": round(k / n, 4) if n else None, "ci95": wilson(k, n),
            "mean_length": round(sum(lengths) / len(lengths), 2) if lengths else None}


def write(out_dir: str, result: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """``out_dir/eval/round-NNN.json`` for this round, ``eval/results.json`` for all so far, and
    ``eval/success.png`` (success rate per task over the rounds) once there are two."""
    folder = os.path.join(out_dir, "eval")
    os.makedirs(folder, exist_ok=True)
    _dump(os.path.join(folder, f"round-{result['round']:03d}.json"), result)
    _dump(os.path.join(folder, "results.json"), {"rounds": [brief(r) for r in history]})
    if len(history) >= 2 and _has_matplotlib():
        plot(history, os.path.join(folder, "success.png"))


def brief(result: dict[str, Any]) -> dict[str, Any]:
    """A round without its per-episode detail: what a report carries."""
    return {k: v for k, v in result.items() if k != "episodes_detail"}


def _dump(path: str, data: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def table(result: dict[str, Any]) -> str:
    """The round as a person reads it: a headline, then one line per task."""
    head = (f"evaluation {result['round']}" + (f" (step {result['step']})" if result.get("step") is not None else "")
            + f": {result['successes']}/{result['episodes']} episodes succeeded, {_pct(result['success_rate'])} "
            f"[95% CI {_ci(result['ci95'])}], policy version {_version(result)}, {result['seconds']:.1f}s")
    width = max([5] + [len(_text(t["task_id"])) for t in result["tasks"]])
    if result.get("protocol"):
        from topo.compiler.render import protocol_line

        head += "\n  " + protocol_line(result["protocol"])
    lines = [head, f"  {'task':>{width}}  {'held-out':8}  {'episodes':>8}  {'success':>7}  {'rate':>6}  {'95% CI':>11}  "
                   f"{'length':>6}  instruction"]
    for t in result["tasks"]:
        lines.append(f"  {_text(t['task_id']):>{width}}  {'yes' if t['held_out'] else 'no':8}  {t['episodes']:>8}  "
                     f"{t['successes']:>7}  {_pct(t['success_rate']):>6}  {_ci(t['ci95']):>11}  "
                     f"{_text(t['mean_length']):>6}  {t['instruction'] or ''}")
    for s in result.get("suites", ()):
        lines.append(f"  suite {s['suite']}: {s['successes']}/{s['episodes']} episodes over {s['tasks']} task(s), "
                     f"{_pct(s['success_rate'])} [95% CI {_ci(s['ci95'])}]")
    for r in result.get("robustness", ()):
        ci = "-" if r["ci95"] is None else f"{100 * r['ci95'][0]:+.1f}..{100 * r['ci95'][1]:+.1f}"
        lines.append(f"  robustness {r['variant']}: {_pct(r['variant_rate'])} against {r['suite']}'s "
                     f"{_pct(r['suite_rate'])} on {r['pairs']} paired episodes: a drop of {_pct(r['drop'])} "
                     f"[95% CI {ci}], McNemar p {r['mcnemar_p']:.3g}")
    if result["other_init_states"]:
        lines.append(f"  warning: episodes {ids_text(result['other_init_states'])} started from other init states "
                     "than planned")
    if result["other_weights"]:
        lines.append(f"  warning: episodes {ids_text(result['other_weights'])} acted with other weights than this round's")
    return "\n".join(lines)


def _version(result: dict[str, Any]) -> str:
    return str(result["policy_version"]) if result.get("policy_version") is not None else "of the factory/checkpoint"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{100 * rate:.1f}%"


def _ci(ci: list[float] | None) -> str:
    return "-" if ci is None else f"{100 * ci[0]:.1f}-{100 * ci[1]:.1f}"


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None  # the ``bench`` extra


def plot(history: list[dict[str, Any]], path: str) -> None:
    """Success rate over the rounds (x: the trainer's step, else the round), overall and per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [r["step"] if r.get("step") is not None else r["round"] for r in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, [r["success_rate"] for r in history], marker="o", linewidth=2, label="all tasks")
    for task in history[-1]["tasks"]:
        rates = [next((t["success_rate"] for t in r["tasks"] if t["task_id"] == task["task_id"]), None)
                 for r in history]
        ax.plot(xs, rates, marker=".", alpha=0.6,
                label=f"task {task['task_id']}" + (" (held out)" if task["held_out"] else ""))
    ax.set_xlabel("training step" if history[-1].get("step") is not None else "evaluation")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
