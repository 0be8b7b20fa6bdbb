"""Predicted against measured: ``topo plan SPEC --estimate`` beside a launch of the same spec, on this host.

    python benchmarks/estimate.py                          # toy 1 x 16, LIBERO 1 x 4, LIBERO 2 x 4, then the refusals
    python benchmarks/estimate.py --shapes toy:1x16 --batches 8

Per shape, one after the other: the estimate (``--format json --force``: its probe runs in a child and is
cached, so the launch after it is checked against the probe's figures) and one ``topo launch --batches B`` of
the same spec through ``topo.bench.runs.launch`` (its process tree's peak resident memory, sampled as ``topo
bench`` samples it). Measured: time to ready (the report's ``all_ready``, from the launch's start), the tree's
peak memory, and frames/s (``frames_per_batch`` over the trainer's mean time collecting one batch, from the
report's time breakdown). Each ratio is measured / predicted; the goals: ready time and peak memory within
+-20 %, frames/s within +-25 %. Then the refusals: LIBERO 1 x 16 refused before any worker starts, 1 x 8
accepted (``topo plan --estimate`` exit codes, from the same cached probe). Results:
``benchmarks/results/estimate.json``.

The specs: ``examples/toy_2x3.yaml`` and ``examples/libero_cpu.yaml`` (64 px, TinyVLA in each subcollector)
reshaped, four frames per worker per batch.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
SPECS = {"toy": "examples/toy_2x3.yaml", "libero": "examples/libero_cpu.yaml"}
SHAPES = "toy:1x16,libero:1x4,libero:2x4"
GOALS = {"ready_s": 0.20, "peak_memory_gb": 0.20, "frames_per_s": 0.25}


def spec_file(family: str, subcollectors: int, workers: int, folder: str) -> str:
    with open(os.path.join(ROOT, SPECS[family])) as f:
        spec = yaml.safe_load(f)
    n = subcollectors * workers
    spec["name"] = f"estimate-{family}-{subcollectors}x{workers}"
    spec["topology"] = {"subcollectors": subcollectors, "workers_per_subcollector": workers}
    spec.setdefault("collector", {})["frames_per_batch"] = 4 * n
    if family == "libero":
        spec["assignment"]["tasks"] = f"0-{max(n // 2 - 1, 0)}"  # groups of 2: one task per group
    path = os.path.join(folder, f"{family}_{subcollectors}x{workers}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    return path


def estimate(path: str, force: bool = True) -> tuple[int, dict | None, str]:
    """``topo plan PATH --estimate --format json``: its exit code, its JSON (printed before a refusal), stderr."""
    done = subprocess.run([sys.executable, "-m", "topo.cli", "plan", path, "--estimate", "--format", "json",
                           *(["--force"] if force else [])],
                          capture_output=True, text=True, env={**os.environ, "MUJOCO_GL": "egl"}, cwd=ROOT)
    start = done.stdout.find("{")
    return done.returncode, json.loads(done.stdout[start:]) if start >= 0 else None, done.stderr[-2000:]


def predicted(est: dict) -> dict:
    mode = est["frames_per_s"]["mode"]
    return {"ready_s": est["ready"]["s"], "peak_memory_gb": est["nodes"]["this host"]["gb"],
            "frames_per_s": est["frames_per_s"][mode], "worker_gb": est["footprint_gb"]["worker_gb"], "mode": mode}


def measured(launch: dict, frames_per_batch: int) -> dict:
    s = launch["summary"] or {}
    pace = ((s.get("time_breakdown") or {}).get("trainer") or {})
    collect = pace.get("collect_s")
    peaks = ((s.get("memory") or {}).get("peak_rss_mb") or {})
    return {"ready_s": (s.get("timings_s") or {}).get("all_ready"), "peak_memory_gb": round(launch["peak_rss_gb"], 2),
            "frames_per_s": round(frames_per_batch / collect, 2) if collect else None,
            "worker_peak_gb_max": round(peaks["max"] / 1024, 3) if "max" in peaks else None,
            "batches": pace.get("batches"), "exit_code": launch["exit_code"],
            "load_average_1m": launch["load_average_1m"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "estimate.json"))
    args = parser.parse_args()
    from topo.bench.runs import launch

    folder = tempfile.mkdtemp(prefix="topo-estimate-")
    cases = []
    for item in args.shapes.split(","):
        family, shape = item.split(":")
        c, w = map(int, shape.split("x"))
        path = spec_file(family, c, w, folder)
        code, est, err = estimate(path)
        if est is None:
            cases.append({"shape": item, "error": err})
            continue
        ran = launch(path, os.path.join(folder, f"{family}_{shape}"), args.batches, [])
        got, want = measured(ran, 4 * c * w), predicted(est)
        ratios = {k: round(got[k] / want[k], 3) if got.get(k) and want.get(k) else None for k in GOALS}
        within = {k: r is not None and abs(r - 1) <= GOALS[k] for k, r in ratios.items()}
        cases.append({"shape": item, "predicted": want, "measured": got, "measured_over_predicted": ratios,
                      "within_goal": within, "probe": est["probe"]["result"], "probe_source": est["probe"]["source"]})
        print(json.dumps(cases[-1]["predicted"]), json.dumps(got), json.dumps(ratios), flush=True)
    refusals = {}
    for w in (16, 8):
        code, est, err = estimate(spec_file("libero", 1, w, folder), force=False)
        refusals[f"libero:1x{w}"] = {"exit_code": code, "refusals": est and est["refusals"],
                                     "memory": est and est["nodes"]["this host"], "stderr": err[-600:]}
        print(f"libero 1x{w}: exit {code}", (est or {}).get("refusals"), flush=True)
    out = {"what": __doc__.split("\n\n")[0].strip(), "host": os.uname().nodename, "cpus": os.cpu_count(),
           "batches": args.batches, "goals": GOALS, "cases": cases, "refusals": refusals,
           "load_average_at_end": os.getloadavg()}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
