"""One LIBERO worker's construction, first reset and later resets, for each builder option alone and all
together, side by side (issue 12). Every run is a fresh process (its own imports and GL); rounds
alternate the variants (A B C ... A B C ...) so drift hits all alike; figures are medians over rounds.

    flock /work/heavy.lock .venv/bin/python benchmarks/libero_worker.py [--rounds 3]
    # writes benchmarks/results/libero_worker.json

libero_spatial task 0, 64 px, agentview, init state 0, seed 0, software EGL. Timed per process, each
phase after the one before: the imports a preloading forkserver shares today (torch, torchrl.envs,
topo's builder), LIBERO and robosuite's imports, robosuite's numba kernels (loaded at the first robot
reset otherwise), then construction (``topo.envs.libero.build``), the first reset, and two more resets
(hard resets where ``hard_reset: true``). Construction thus counts no import. Each run also hashes its
first observation (image, state, qpos, qvel): every variant must give the same hash.

Also measured once: what importing LIBERO maps into a process that holds GL (``topo.runtime.gl``), i.e. what an
extended forkserver preload would hand its workers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "libero_worker.json"
# fixtures_by_init_state stays off: it moves the fixtures on purpose (the hashes below compare first
# observations) and costs nothing measurable (one seeding of numpy's RNG per reset)
OFF = {"model_cache": False, "skip_unread_renders": False, "reset_gripper": False, "fixtures_by_init_state": False}
ON = {"model_cache": True, "skip_unread_renders": True, "reset_gripper": True, "fixtures_by_init_state": False}
#: name -> (hard_reset, options, cache state: "warm" (entry present), "cold" (empty directory) or None)
VARIANTS = {
    "baseline": (False, OFF, None),
    "cache, warm": (False, {**OFF, "model_cache": True}, "warm"),
    "cache, cold": (False, {**OFF, "model_cache": True}, "cold"),
    "skip unread renders": (False, {**OFF, "skip_unread_renders": True}, None),
    "gripper reset": (False, {**OFF, "reset_gripper": True}, None),
    "all, warm cache": (False, ON, "warm"),
    "all, cold cache": (False, ON, "cold"),
    "hard reset: baseline": (True, OFF, None),
    "hard reset: all, warm cache": (True, ON, "warm"),
}

WORKER = """
    import hashlib, json, os, sys, time
    t0 = time.perf_counter()
    import torch, torchrl.envs, topo.worker, topo.envs.libero as L
    t1 = time.perf_counter()
    L.configure_rendering(None)
    L.prepare_libero()
    import libero.libero.envs
    t2 = time.perf_counter()
    import numpy as np
    from robosuite.utils import transform_utils as T
    T.mat2quat(np.eye(3)); T.mat2quat(np.eye(4)[:3, :3]); T.quat2mat(np.array([0.0, 0.0, 0.0, 1.0]))
    t3 = time.perf_counter()
    env = L.build(json.loads(sys.argv[1]))
    env.set_seed(0)
    t4 = time.perf_counter()
    td = env.reset()
    t5 = time.perf_counter()
    sim = env._env.env.sim
    digest = hashlib.sha256()
    for array in (td["observation", "image"].numpy(), td["observation", "state"].numpy(), sim.data.qpos, sim.data.qvel):
        digest.update(np.ascontiguousarray(array).tobytes())
    resets = []
    for _ in range(2):
        start = time.perf_counter()
        env.reset()
        resets.append(time.perf_counter() - start)
    print(json.dumps({"imports_shared_s": t1 - t0, "imports_libero_s": t2 - t1, "numba_kernels_s": t3 - t2,
                      "construction_s": t4 - t3, "first_reset_s": t5 - t4, "later_resets_s": resets,
                      "first_observation_sha256": digest.hexdigest(), "renders": dict(getattr(env, "topo_renders", {})),
                      "model_cache": getattr(env, "topo_model_cache", None)}))
    env.close()
"""

HELD_IMPORT = """
    import json, os
    from topo.runtime import gl
    gl.hold()
    import torch, torchrl.envs, topo.worker, topo.envs.libero as L
    before = gl.loaded_libraries()
    L.seed_libero_config()
    import libero.libero.envs
    print(json.dumps({"after_torchrl": before, "after_libero": gl.loaded_libraries(),
                      "mujoco_gl_after": os.environ.get("MUJOCO_GL"),
                      "opencv_imported": "cv2" in __import__("sys").modules}))
"""


def python(code: str, *args: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "MUJOCO_GL": "egl", **(env or {})},
                          stdin=subprocess.DEVNULL, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-4000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_variant(name: str, warm_dir: Path, scratch: Path) -> dict:
    hard, options, cache = VARIANTS[name]
    if cache == "warm":
        options = {**options, "model_cache": str(warm_dir)}
    elif cache == "cold":
        cold = scratch / "cold"
        shutil.rmtree(cold, ignore_errors=True)
        options = {**options, "model_cache": str(cold)}
    env = {"task_suite": "libero_spatial", "task_id": 0, "camera_height": 64, "camera_width": 64,
           "init_state_mode": "fixed", "init_state_id": 0, "env_kwargs": {"hard_reset": hard}, "options": options}
    started = time.time()
    record = python(WORKER, json.dumps(env), env={"TOPO_MODEL_CACHE": str(scratch / "unused")})
    record["wall_s"] = time.time() - started
    record["construction_and_first_reset_s"] = record["construction_s"] + record["first_reset_s"]
    record["later_reset_s"] = statistics.mean(record["later_resets_s"])
    return record


def summary(runs: list[dict]) -> dict:
    keys = ("imports_shared_s", "imports_libero_s", "numba_kernels_s", "construction_s", "first_reset_s",
            "construction_and_first_reset_s", "later_reset_s")
    out = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    out["construction_and_first_reset_range_s"] = [round(min(r["construction_and_first_reset_s"] for r in runs), 3),
                                                   round(max(r["construction_and_first_reset_s"] for r in runs), 3)]
    out["first_observation_sha256"] = sorted({r["first_observation_sha256"] for r in runs})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="topo-bench-cache-"))
    warm_dir = scratch / "warm"
    try:
        load_before = os.getloadavg()
        # fill the warm cache the way a worker would, in a process of its own (not timed)
        python(WORKER, json.dumps({"task_suite": "libero_spatial", "task_id": 0, "camera_height": 64,
                                   "camera_width": 64, "env_kwargs": {"hard_reset": False},
                                   "options": {**OFF, "model_cache": str(warm_dir)}}))
        runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            for name in VARIANTS:
                record = run_variant(name, warm_dir, scratch)
                runs[name].append(record)
                print(f"round {r + 1} {name:28s} construction {record['construction_s']:5.2f} s, first reset "
                      f"{record['first_reset_s']:5.2f} s, later resets {record['later_reset_s']:5.2f} s", flush=True)
        held = python(HELD_IMPORT)
        load_after = os.getloadavg()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    import mujoco

    medians = {name: summary(r) for name, r in runs.items()}
    base, best = medians["baseline"], medians["all, warm cache"]
    hard_base, hard_best = medians["hard reset: baseline"], medians["hard reset: all, warm cache"]
    results = {
        "what": "one libero_spatial task-0 worker, 64 px, agentview, software EGL: medians of fresh processes",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "mujoco": mujoco.__version__, "loadavg_before": load_before, "loadavg_after": load_after},
        "rounds": args.rounds,
        "variants": {name: {"hard_reset": VARIANTS[name][0], "options": VARIANTS[name][1], "cache": VARIANTS[name][2]}
                     for name in VARIANTS},
        "medians": medians,
        "ratios": {
            "construction_and_first_reset_all_warm_vs_baseline": round(
                best["construction_and_first_reset_s"] / base["construction_and_first_reset_s"], 3),
            "construction_and_first_reset_all_cold_vs_baseline": round(
                medians["all, cold cache"]["construction_and_first_reset_s"] / base["construction_and_first_reset_s"], 3),
            "hard_reset_all_warm_vs_baseline": round(hard_best["later_reset_s"] / hard_base["later_reset_s"], 3),
            "hard_construction_and_first_reset_all_warm_vs_baseline": round(
                hard_best["construction_and_first_reset_s"] / hard_base["construction_and_first_reset_s"], 3),
        },
        "targets": {"construction_and_first_reset_vs_baseline": 0.40, "hard_reset_vs_baseline": 0.50},
        "bit_identical_first_observation": len({h for m in medians.values() for h in m["first_observation_sha256"]}) == 1,
        "preload_candidates": {
            "per_worker_s": round(base["imports_libero_s"] + base["numba_kernels_s"], 3),
            "gl_libraries_when_imported_with_gl_held": held,
        },
        "runs": runs,
    }
    results["met"] = {
        "construction_and_first_reset": results["ratios"]["construction_and_first_reset_all_warm_vs_baseline"] <= 0.40,
        "hard_reset": results["ratios"]["hard_reset_all_warm_vs_baseline"] <= 0.50,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({"medians": {k: {x: v[x] for x in ("construction_s", "first_reset_s", "later_reset_s")}
                                  for k, v in medians.items()}, "ratios": results["ratios"], "met": results["met"],
                      "bit_identical": results["bit_identical_first_observation"],
                      "preload_candidates": results["preload_candidates"]}, indent=1))


if __name__ == "__main__":
    main()
