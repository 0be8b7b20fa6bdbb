"""Memory per worker over a run with a leaking worker, without and with health budgets (``launch.recycle``).

    python benchmarks/recycle_memory.py                 # 160 batches each way, 1 MB leaked per step
    python benchmarks/recycle_memory.py --batches 40

``examples/toy_recycle.yaml`` (2 x 2, sync), its toy env replaced by ``tests/launch/unhealthy.py``: the
worker planned with seed 1 (subcollector 0, worker 1) allocates and holds ``--leak-mb`` MB per step, and
so does its successor in every restart (its seed is 1 modulo the 4 workers), every step sleeps 2 ms. Run twice on real torchrl processes (under /work/heavy.lock): without the
``recycle`` section (its memory grows with every step) and with the example's (``max_rss_gb``: its
subcollector is rebuilt each time the worker crosses it). Each batch, ``run.worker_memory()`` is recorded
(:file:`tests/launch/recycling.py`). Results: ``benchmarks/results/recycle_memory.json`` and, with
matplotlib, ``recycle_memory.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "tests", "launch")
EXAMPLE = os.path.join(ROOT, "examples", "toy_recycle.yaml")
sys.path.insert(0, TESTS)
from script_events import parse  # noqa: E402 - the script's events, as the tests read them
LEAKER = (0, 1)  # (subcollector, worker) planned with seed 1


def spec(leak_mb: int, recycle: bool) -> dict:
    data = yaml.safe_load(open(EXAMPLE))
    workers = data["topology"]["subcollectors"] * data["topology"]["workers_per_subcollector"]
    data["env"] = {"backend": "unhealthy:unhealthy", "kwargs": {**data["env"]["kwargs"], "leak_seed": 1, "leak_mb": leak_mb,
                                                                 "leak_stride": workers, "step_ms": 2.0}}
    data["name"] = f"recycle-memory-{'with' if recycle else 'without'}"
    if not recycle:
        del data["launch"]["recycle"]
    return data


def run(leak_mb: int, batches: int, recycle: bool, folder: str) -> dict:
    path = os.path.join(folder, f"{'with' if recycle else 'without'}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec(leak_mb, recycle), f)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, os.path.join(TESTS, "recycling.py"), path, "--batches", str(batches)],
                          env=env, capture_output=True, text=True, timeout=1800)
    events = list(parse(done.stdout))
    if done.returncode or not events or events[-1]["event"] != "after":
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    ready = events[0]["time"]
    series = [{"t_s": round(e["time"] - ready, 2), "frames": e["frames"],
               "rss_mb": {f"sub{c}/w{w}": rss for c, w, _, rss in e["memory"]},
               "restart": {f"sub{c}/w{w}": k for c, w, k, _ in e["memory"]}}
              for e in events if e["event"] == "batch"]
    report = events[-1]["report"]
    leaker = f"sub{LEAKER[0]}/w{LEAKER[1]}"
    others = sorted({k for s in series for k in s["rss_mb"]} - {leaker})
    return {
        "recycle": spec(leak_mb, recycle)["launch"].get("recycle"),
        "batches": len(series), "frames": sum(s["frames"] for s in series),
        "wall_s": series[-1]["t_s"],
        "leaker": leaker,
        "leaker_rss_mb": {"first": series[0]["rss_mb"][leaker], "max": max(s["rss_mb"][leaker] or 0 for s in series),
                          "last": series[-1]["rss_mb"][leaker]},
        "others_rss_mb_max": max((s["rss_mb"][k] or 0) for s in series for k in others),
        "recycles": [{k: r[k] for k in ("subcollector", "restart", "reason", "decided_s", "rebuild_s")}
                     for r in events[-1]["recycles"]],
        "report_lines": [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("recycled ")],
        "restarts": len(report["restarts"]),
        "left_behind": len(report["processes"]["left_behind"]), "alive_after": len(report["processes"]["alive_after"]),
        "series": series,
    }


def plot(results: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for mode, style in (("without", "tab:red"), ("with", "tab:blue")):
        r = results[mode]
        ax.plot([s["t_s"] for s in r["series"]], [s["rss_mb"][r["leaker"]] for s in r["series"]], color=style,
                drawstyle="steps-post", label=f"leaking worker, {mode} recycle" + (f" ({len(r['recycles'])} recycles)" if r["recycles"] else ""))
        others = [k for k in r["series"][0]["rss_mb"] if k != r["leaker"]]
        ax.plot([s["t_s"] for s in r["series"]], [max(s["rss_mb"][k] or 0 for k in others) for s in r["series"]],
                color=style, linestyle=":", label=f"other workers (max), {mode} recycle")
    limit = results["with"]["recycle"]["max_rss_gb"] * 1024
    ax.axhline(limit, color="gray", linewidth=0.8, linestyle="--", label=f"max_rss_gb {limit / 1024:g}")
    ax.set_xlabel("seconds since the run was ready (RSS as read at each batch)")
    ax.set_ylabel("worker RSS (MB)")
    ax.set_title(f"toy 2x2, one worker leaking {results['leak_mb']} MB per step")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=160)
    parser.add_argument("--leak-mb", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "recycle_memory.json"))
    args = parser.parse_args()
    results = {"leak_mb": args.leak_mb, "frames_per_batch": spec(1, True)["collector"]["frames_per_batch"],
               "machine": {"cpus": os.cpu_count(), "load_before": os.getloadavg()[0]},
               "date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("without", "with"):
            results[mode] = run(args.leak_mb, args.batches, mode == "with", folder)
            r = results[mode]
            print(f"{mode} recycle: {r['batches']} batches, {r['frames']} frames in {r['wall_s']:.0f}s; leaking worker "
                  f"{r['leaker_rss_mb']['first']:.0f} -> max {r['leaker_rss_mb']['max']:.0f} MB, last "
                  f"{r['leaker_rss_mb']['last']:.0f} MB; others max {r['others_rss_mb_max']:.0f} MB; "
                  f"{len(r['recycles'])} recycle(s), rebuild {[x['rebuild_s'] for x in r['recycles']]} s", flush=True)
    results["machine"]["load_after"] = os.getloadavg()[0]
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    if plot(results, os.path.splitext(args.out)[0] + ".png"):
        print(f"plot: {os.path.splitext(args.out)[0]}.png")


if __name__ == "__main__":
    main()
