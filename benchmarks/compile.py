"""Compile-time benchmark (issue 2): in-process compile of the 5 x 64 example and of 100,000 workers,
and the wall time of `topo plan --dry-run` on the 5 x 64 example as a whole process.

    .venv/bin/python benchmarks/compile.py   # writes benchmarks/results/compile.json
Targets: 100,000 workers compile in < 1 s; the CLI answers the 5 x 64 dry-run in < 0.5 s.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

import topo
from topo.compiler.load import parse

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "libero_spatial_5x64.yaml"
BIG = {
    "version": 1, "name": "toy-1000x100",
    "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
    "topology": {"subcollectors": 1000, "workers_per_subcollector": 100},
    "assignment": {"tasks": "0-9", "groups": {"size": 10, "candidate_size": 20, "parallel_repeats": True},
                   "init_states": {"mode": "cycle"}, "seeds": {"base": 0}},
}


def timed(fn, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"min_s": min(times), "median_s": statistics.median(times), "max_s": max(times), "repeats": repeats}


def main() -> None:
    big_text = yaml.safe_dump(BIG)
    topo.compile_spec(EXAMPLE)  # warm caches (schema, LIBERO catalog) as a long-lived process would have
    results = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "compile_5x64": timed(lambda: topo.compile_spec(EXAMPLE), 20),
        "compile_100000": timed(lambda: topo.compile_source(parse(big_text, "big.yaml")), 5),
        "cli_dry_run_5x64": timed(lambda: subprocess.run(
            [str(Path(sys.executable).with_name("topo")), "plan", str(EXAMPLE), "--dry-run"],
            check=True, stdout=subprocess.DEVNULL), 10),
        "targets": {"compile_100000_s": 1.0, "cli_dry_run_5x64_s": 0.5},
    }
    results["met"] = {
        "compile_100000": results["compile_100000"]["median_s"] < 1.0,
        "cli_dry_run_5x64": results["cli_dry_run_5x64"]["median_s"] < 0.5,
    }
    out = ROOT / "benchmarks" / "results" / "compile.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
