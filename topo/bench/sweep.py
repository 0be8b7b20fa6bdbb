"""``topo bench SPEC --sweep VAR=1,2,4,8``: time to ready against the number of workers, fitted as
intercept + slope x N (least squares over every run that got ready), beside each mode's lower bound at
each N, so the cost of growth is visible: the slope is what one more worker costs."""
from __future__ import annotations

import statistics
from typing import Any

from topo.bench.compare import Costs, Shape, lower_bound, spread, split_mode


def parse(value: str) -> tuple[str, list[str]]:
    """``"workers=1,2,4,8"`` -> ``("workers", ["1", "2", "4", "8"])``; ValueError when malformed."""
    name, sep, values = value.partition("=")
    points = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name.strip() or len(points) < 2:
        raise ValueError(f"--sweep takes VAR=V1,V2,... with two values or more, got {value!r}")
    return name.strip(), points


def fit(points: list[tuple[float, float]]) -> dict[str, float] | None:
    """Least squares ``y = intercept + slope x``, with r^2; None with fewer than two distinct x."""
    xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
    if len(set(xs)) < 2:
        return None
    slope, intercept = statistics.linear_regression(xs, ys)
    residual = sum((y - intercept - slope * x) ** 2 for x, y in zip(xs, ys))
    total = sum((y - statistics.fmean(ys)) ** 2 for y in ys)
    return {"slope_s_per_worker": round(slope, 3), "intercept_s": round(intercept, 3),
            "r2": round(1.0 - residual / total, 4) if total else 1.0, "points": len(xs)}


def result(runs: list[dict[str, Any]], shapes: dict[str, Shape], costs: Costs | None, cores: int,
           labels: list[str], cap: int | None = None, own_builder: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """Per mode label: each sweep value's workers, time to ready and bound (none for a mode in ``own_builder``,
    whose workers the single-worker measurement does not describe); the fit of each."""
    out = {}
    for label in labels:
        mode, cold = split_mode(label)
        mode_costs = None if mode in own_builder else costs
        points, ready = [], []
        for value, shape in shapes.items():
            mine = [r for r in runs if r["mode"] == label and r["value"] == value]
            times = [r["summary"]["timings_s"]["all_ready"] for r in mine if r["exit_code"] == 0 and r["summary"]]
            ready += [(shape.workers, t) for t in times if t is not None]
            bound = lower_bound(mode, shape, mode_costs, cores, cold=cold, cap=cap)["s"] if mode_costs else None
            points.append({"value": value, "workers": shape.workers, "runs": len(mine), "ready_s": times,
                           "all_ready_s": spread(times),
                           "first_batch_s": spread([r["summary"]["timings_s"].get("first_batch")
                                                    for r in mine if r["exit_code"] == 0 and r["summary"]]),
                           "lower_bound_s": bound})
        out[label] = {"points": points, "fit": fit(ready),
                      "bound_slope_s_per_worker": _bound_slope(mode, next(iter(shapes.values())), mode_costs, cores)}
    return out


def _bound_slope(mode: str, shape: Shape, costs: Costs | None, cores: int) -> float | None:
    """What one more worker adds to the bound's work, per core: the slope no run can go below at large N."""
    if costs is None:
        return None
    more = Shape(shape.workers + 1, shape.subcollectors, shape.most_per_subcollector + 1)
    return round((lower_bound(mode, more, costs, cores)["work_s"] - lower_bound(mode, shape, costs, cores)["work_s"])
                 / max(cores, 1), 3)


def table(sweep: dict[str, Any], variable: str) -> str:
    lines = [f"{'mode':<24} {variable + ' =':>10} {'workers':>7} {'all ready':>16} {'bound':>7}"]
    for label, m in sweep.items():
        for p in m["points"]:
            ready = p["all_ready_s"]
            lines.append(f"{label:<24} {p['value']:>10} {p['workers']:>7} "
                         f"{'-' if not ready else format(ready['median'], '.1f') + ' s [' + format(ready['min'], '.0f') + '-' + format(ready['max'], '.0f') + ']':>16} "
                         f"{'-' if p['lower_bound_s'] is None else format(p['lower_bound_s'], '.1f') + ' s':>7}")
        f, floor = m["fit"], m["bound_slope_s_per_worker"]
        if f:
            lines.append(f"{label}: time to ready = {f['intercept_s']:.2f} s + {f['slope_s_per_worker']:.3f} s x workers "
                         f"(r^2 {f['r2']:.3f}, {f['points']} runs)"
                         + (f"; the bound grows {floor:.3f} s per worker" if floor is not None else ""))
    return "\n".join(lines)
