"""Run one bench measurement: a full ``topo launch`` of a plan variant, or one worker alone; and the
bench's model cache, warmed (``topo cache warm``) or emptied before a run.

Each launch is the real command in a subprocess (ready, first batch, shutdown, report), sampled for
the resident memory of its whole process tree while it runs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from typing import Any

import psutil

SAMPLE_S = 0.25


def launch(plan_path: str, out_dir: str, batches: int, extra: list[str]) -> dict[str, Any]:
    """``topo launch PLAN --report OUT_DIR``; returns the summary plus wall time and peak tree memory."""
    os.makedirs(out_dir, exist_ok=True)
    command = [sys.executable, "-m", "topo.cli", "launch", plan_path, "--report", out_dir, "--quiet",
               "--batches", str(batches), *extra]
    with open(os.path.join(out_dir, "command.json"), "w") as f:
        json.dump({"argv": command, "cwd": os.getcwd()}, f, indent=1)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    with open(os.path.join(out_dir, "launch.log"), "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        peak_rss = peak_procs = 0
        while proc.poll() is None:
            rss, count = _tree(proc.pid)
            peak_rss, peak_procs = max(peak_rss, rss), max(peak_procs, count)
            time.sleep(SAMPLE_S)
    wall = time.perf_counter() - started
    summary_path = os.path.join(out_dir, "summary.json")
    summary = None
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    return {"exit_code": proc.returncode, "wall_s": wall, "peak_rss_gb": peak_rss / 1024**3,
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "peak_tree_processes": peak_procs, "summary": summary, "dir": out_dir}


def single(plan_path: str) -> dict[str, Any]:
    """One worker alone in a fresh process: process start, imports, construction, first reset."""
    from topo.bench.single import T0_VAR

    started = time.perf_counter()
    env = {**os.environ, T0_VAR: repr(time.time())}
    done = subprocess.run([sys.executable, "-m", "topo.bench.single", plan_path], capture_output=True, text=True,
                          env=env, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"single-worker measurement failed:\n{done.stderr[-2000:]}")
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, **phases}


def clear_cache(directory: str) -> None:
    """Empty the bench's model cache: the next run starts cold."""
    shutil.rmtree(directory, ignore_errors=True)


def warm_cache(spec: str, assignments: list[str], directory: str) -> float:
    """``topo cache warm SPEC --dir DIRECTORY``: every model of the plan compiled; returns the seconds it took."""
    started = time.perf_counter()
    command = [sys.executable, "-m", "topo.cli", "cache", "warm", spec, "--dir", directory,
               *(a for pair in assignments for a in ("--set", pair))]
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"topo cache warm failed:\n{done.stderr[-2000:]}")
    return time.perf_counter() - started


def _tree(pid: int) -> tuple[int, int]:
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    rss = 0
    for p in procs:
        try:
            rss += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return rss, len(procs)
