"""The run's forkserver against spawned subcollectors: ``topo launch`` of one spec, ``start_method.subcollectors``
``forkserver`` (topo's default: one forkserver forks every subcollector and env worker) or ``spawn`` (each
subcollector imports torch and torchrl, then its own forkserver imports them again), alternated over rounds.

Per launch: the wall time of the command, the report's ``all_ready``, and the CPU seconds of every process of the
run, read from ``/proc`` every 0.1 s (a process forked from a forkserver is reaped by it, not by the command, so the
command's own accounting misses some). Results: ``benchmarks/results/run_forkserver.json``.

    .venv/bin/python benchmarks/run_forkserver.py [--rounds 3] [--spec examples/toy_2x3.yaml]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")
CASES = ("forkserver", "spawn")


def _stat(pid: str) -> tuple[int, float] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def launch(spec: str, report: str) -> dict:
    """One ``topo launch``: wall, the report's all_ready, the CPU seconds of its process tree (forks included)."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "topo", "launch", spec, "--quiet", "--report", report], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu: dict[str, float] = {}
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                seen = _stat(pid)
                if seen and (int(pid) == proc.pid or pid in cpu or str(seen[0]) in cpu or seen[0] == proc.pid):
                    cpu[pid] = max(cpu.get(pid, 0.0), seen[1])
        time.sleep(0.1)
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"launch failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
    summary = json.load(open(os.path.join(report, "summary.json")))
    return {"wall_s": round(wall, 2), "all_ready_s": summary["timings_s"]["all_ready"],
            "cpu_s": round(sum(cpu.values()), 2), "processes": len(cpu)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spec", default="examples/toy_2x3.yaml")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "run_forkserver.json"))
    args = parser.parse_args()
    data = yaml.safe_load(open(os.path.join(ROOT, args.spec)))
    runs: dict[str, list[dict]] = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        specs = {}
        for case in CASES:
            variant = json.loads(json.dumps(data))
            variant["topology"]["start_method"] = {"subcollectors": case}
            specs[case] = os.path.join(tmp, f"{case}.yaml")
            with open(specs[case], "w") as f:
                yaml.safe_dump(variant, f)
        for r in range(args.rounds):
            for case in CASES:
                runs[case].append(launch(specs[case], os.path.join(tmp, f"{case}-{r}")))
                print(case, runs[case][-1], flush=True)
    medians = {case: {k: statistics.median(run[k] for run in runs[case]) for k in runs[case][0]} for case in CASES}
    ratio = {k: round(medians["forkserver"][k] / medians["spawn"][k], 2) for k in ("wall_s", "all_ready_s", "cpu_s")}
    out = {"what": __doc__.split("\n\n")[0], "spec": args.spec, "rounds": args.rounds, "cores": os.cpu_count(),
           "runs": runs, "medians": medians, "forkserver_over_spawn": ratio}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps({"medians": medians, "forkserver_over_spawn": ratio}))


if __name__ == "__main__":
    main()
