"""Two checkpoints on the same episodes: the paired comparison of their success rates.

Each episode (suite, task, init state, seed) is run once by checkpoint A and once by B; a pair is
*discordant* when one succeeds and the other fails. For the ``n`` pairs, with ``b`` won by A only and ``c``
by B only:

- the difference ``p_A - p_B = (b - c) / n`` with Newcombe's (1998, method 10) 95 % interval for paired
  proportions: each rate's Wilson interval, joined through the pairs' correlation;
- the exact McNemar test: under "no difference" the ``b`` of ``b + c`` discordant pairs are Binomial(b + c, 1/2)
  (two-sided p, scipy's ``binomtest``);
- the pairs a difference ``delta`` needs (Connor 1987: 5 % two-sided, 80 % power by default), from the
  discordant share this run observed, no lower than ``delta`` itself (the least it can be).

Pure: plain lists of outcomes in, JSON-ready dicts out (scipy for the distributions).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

__all__ = ["by_group", "compare", "mcnemar_p", "newcombe", "pairs_needed", "table"]


def mcnemar_p(b: int, c: int) -> float:
    """The exact two-sided McNemar p-value of ``b`` and ``c`` discordant pairs (1.0 without any)."""
    if b + c == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(b, b + c, 0.5).pvalue)


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe(both: int, a_only: int, b_only: int, neither: int, level: float = 0.95) -> tuple[float, float] | None:
    """Newcombe's interval for ``p_A - p_B`` over paired outcomes (the four cells of the 2 x 2 table)."""
    n = both + a_only + b_only + neither
    if n == 0:
        return None
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2))
    p1, p2 = (both + a_only) / n, (both + b_only) / n
    l1, u1 = _wilson(both + a_only, n, z)
    l2, u2 = _wilson(both + b_only, n, z)
    d = p1 - p2
    margins = (both + a_only) * (b_only + neither) * (both + b_only) * (a_only + neither)
    if margins == 0:
        phi = 0.0
    else:
        product = both * neither - a_only * b_only
        phi = (max(product - n / 2, 0.0) if product > 0 else product) / math.sqrt(margins)
    lower = d - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = d + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, lower), min(1.0, upper)


def pairs_needed(delta: float, discordant: float | None, alpha: float = 0.05, power: float = 0.8) -> int:
    """Paired episodes that find a difference ``delta`` in success rate with this power (Connor 1987), when a
    share ``discordant`` of pairs disagree (None: unknown, taken at its least, ``delta``)."""
    from scipy.stats import norm

    delta = abs(delta)
    if not 0 < delta <= 1:
        raise ValueError(f"a difference to detect is in (0, 1], got {delta}")
    psi = max(discordant or 0.0, delta)
    za, zb = float(norm.ppf(1 - alpha / 2)), float(norm.ppf(power))
    n = (za * math.sqrt(psi) + zb * math.sqrt(max(psi - delta * delta, 0.0))) ** 2 / (delta * delta)
    return math.ceil(n - 1e-9)


def compare(a: Sequence[bool], b: Sequence[bool], detect: float | None = None) -> dict:
    """Checkpoints A and B on the same episodes, ``a[i]`` and ``b[i]`` one episode's outcomes."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes differ in length: {len(a)} and {len(b)}")
    n = len(a)
    both = sum(1 for x, y in zip(a, b) if x and y)
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    neither = n - both - a_only - b_only
    interval = newcombe(both, a_only, b_only, neither)
    out = {
        "pairs": n,
        "rate_a": round((both + a_only) / n, 4) if n else None,
        "rate_b": round((both + b_only) / n, 4) if n else None,
        "difference": round((a_only - b_only) / n, 4) if n else None,
        "ci95": None if interval is None else [round(interval[0], 4), round(interval[1], 4)],
        "discordant": {"a_only": a_only, "b_only": b_only},
        "mcnemar_p": mcnemar_p(a_only, b_only),
    }
    if detect is not None:
        needed = pairs_needed(detect, (a_only + b_only) / n if n else None)
        out["detect"] = {"difference": detect, "pairs_needed": needed, "enough": n >= needed}
    return out


def suite_of(task: Any) -> str | None:
    """The suite of a suite-qualified task id (``"libero_goal:3"``); None for a plain id."""
    return task.partition(":")[0] if isinstance(task, str) and ":" in task else None


def by_group(result_a: dict, result_b: dict, detect: float | None = None) -> dict:
    """Two rounds over the same planned episodes, paired by episode number (those that ended in both): overall,
    per suite (where task ids name one) and per task."""
    ended_b = {e["episode"]: e for e in result_b["episodes_detail"] if e.get("ended")}
    pairs = [(e, ended_b[e["episode"]]) for e in result_a["episodes_detail"]
             if e.get("ended") and e["episode"] in ended_b]
    groups: dict[str, dict[Any, list]] = {"per_suite": {}, "per_task": {}}
    for a, b in pairs:
        groups["per_task"].setdefault(a["task_id"], []).append((a, b))
        if suite_of(a["task_id"]) is not None:
            groups["per_suite"].setdefault(suite_of(a["task_id"]), []).append((a, b))

    def figures(some: list) -> dict:
        return compare([bool(a["success"]) for a, _ in some], [bool(b["success"]) for _, b in some], detect)

    return {"overall": figures(pairs), "unpaired": len(result_a["episodes_detail"]) - len(pairs),
            "per_suite": [{"suite": name, **figures(some)} for name, some in groups["per_suite"].items()],
            "per_task": [{"task_id": task, **figures(some)} for task, some in groups["per_task"].items()]}


def table(comparison: dict, name_a: str, name_b: str) -> str:
    """The comparison as a person reads it: a headline, then a line per suite and per task."""
    o = comparison["overall"]
    lines = [f"A = {name_a}, B = {name_b}: {o['pairs']} paired episodes"
             + (f" ({comparison['unpaired']} unpaired, left out)" if comparison["unpaired"] else ""),
             f"  {'':18}  {'pairs':>5}  {'A':>6}  {'B':>6}  {'A - B':>7}  {'95% CI':>15}  {'A only':>6}  "
             f"{'B only':>6}  {'McNemar p':>9}"]
    rows = [("overall", o)] + [(f"suite {g['suite']}", g) for g in comparison["per_suite"]] \
        + [(f"task {g['task_id']}", g) for g in comparison["per_task"]]
    for label, g in rows:
        ci = "-" if g["ci95"] is None else f"{100 * g['ci95'][0]:+.1f}..{100 * g['ci95'][1]:+.1f}"
        lines.append(f"  {label[:18]:18}  {g['pairs']:>5}  {_pct(g['rate_a']):>6}  {_pct(g['rate_b']):>6}  "
                     f"{_pct(g['difference'], '+'):>7}  {ci:>15}  {g['discordant']['a_only']:>6}  "
                     f"{g['discordant']['b_only']:>6}  {g['mcnemar_p']:>9.4g}")
    if "detect" in o:
        d = o["detect"]
        lines.append(f"  a difference of {100 * d['difference']:.1f} points needs {d['pairs_needed']} paired episodes "
                     f"(5 % two-sided, 80 % power): this run had {o['pairs']}, "
                     + ("enough" if d["enough"] else "too few"))
    return "\n".join(lines)


def _pct(rate: float | None, sign: str = "") -> str:
    return "-" if rate is None else f"{100 * rate:{sign}.1f}%"


def write(path: str, comparison: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(comparison, handle, indent=1)
        handle.write("\n")
