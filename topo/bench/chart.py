"""``startup.png``: time to ready and to first batch per mode (median, bars from min to max), the lower bound."""
from __future__ import annotations

from typing import Any

from .compare import parent_envs


def draw(result: dict[str, Any], path: str, title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    bound = result.get("lower_bound_s")
    if bound:
        ax.axhline(bound, color="#a03030", linestyle="--", linewidth=1, label=f"lower bound {bound:.0f} s")
    labels = []
    for mode in modes:
        c = result["modes"][mode]["constructions"]
        parent = parent_envs(c)
        labels.append(f"{mode}\n{parent} parent envs")
    ax.set_xticks(range(len(modes)), labels, fontsize=8)
    ax.set_ylabel("seconds from launch")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
