"""The bench's charts: ``startup.png`` (time to ready and to first batch per mode, median with bars from min
to max, each mode's lower bound) and ``sweep.png`` (time to ready against workers, the fit, the bound)."""
from __future__ import annotations

from typing import Any

from topo.bench.compare import parent_envs


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw(result: dict[str, Any], path: str, title: str) -> str:
    plt = _pyplot()
    modes = [m for m, v in result["modes"].items() if v["all_ready_s"]]
    fig, ax = plt.subplots(figsize=(1.6 * len(modes) + 3, 4.2), dpi=110)
    width = 0.38
    for offset, key, label, color in ((-width / 2, "all_ready_s", "all ready", "#4878a8"),
                                      (width / 2, "first_batch_s", "first batch", "#e0a040")):
        xs, meds, lo, hi = [], [], [], []
        for i, mode in enumerate(modes):
            s = result["modes"][mode][key]
            if not s:
                continue
            xs.append(i + offset)
            meds.append(s["median"])
            lo.append(s["median"] - s["min"])
            hi.append(s["max"] - s["median"])
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=label, color=color)
        for x, m in zip(xs, meds):
            ax.text(x, m, f"{m:.0f}", ha="center", va="bottom", fontsize=8)
    bounds = [(i, result["modes"][m]["lower_bound"]) for i, m in enumerate(modes) if result["modes"][m]["lower_bound"]]
    for n, (i, bound) in enumerate(bounds):
        ax.hlines(bound["s"], i - width, i + width, colors="#a03030", linestyles="--", linewidth=1.2,
                  label="lower bound (per mode)" if n == 0 else None)
    labels = []
    for mode in modes:
        parent = parent_envs(result["modes"][mode]["constructions"])
        name = mode.replace("/cold", "\ncold cache")
        labels.append(f"{name}\n{parent} parent envs")
    ax.set_xticks(range(len(modes)), labels, fontsize=8)
    ax.set_ylabel("seconds from launch")
    return _save(plt, fig, ax, path, title, 8)


def draw_sweep(sweep: dict[str, Any], path: str, title: str) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.4), dpi=110)
    colors = ["#4878a8", "#e0a040", "#50a060", "#a04890", "#707070", "#c05040", "#40a0b0"]
    for k, (label, m) in enumerate(sweep.items()):
        color = colors[k % len(colors)]
        done = [(p["workers"], t) for p in m["points"] for t in p["ready_s"]]
        ax.scatter([x for x, _ in done], [y for _, y in done], s=14, color=color, alpha=0.7)
        xs = sorted(p["workers"] for p in m["points"])
        f = m["fit"]
        if f:
            ax.plot(xs, [f["intercept_s"] + f["slope_s_per_worker"] * x for x in xs], color=color,
                    label=f"{label}: {f['intercept_s']:.1f} s + {f['slope_s_per_worker']:.2f} s x N (r² {f['r2']:.2f})")
        bound = [(p["workers"], p["lower_bound_s"]) for p in m["points"] if p["lower_bound_s"] is not None]
        if bound:
            ax.plot([x for x, _ in bound], [y for _, y in bound], color=color, linestyle="--", linewidth=1,
                    label=f"{label}: lower bound")
    ax.set_xlabel("env workers (N)")
    ax.set_ylabel("seconds from launch to all ready")
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    return _save(plt, fig, ax, path, title, 7)


def _save(plt, fig, ax, path: str, title: str, legend_size: int) -> str:
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
