"""Recovery on real LIBERO: seconds from a worker's death to the next batch, against a full relaunch.

    MUJOCO_GL=egl python benchmarks/recovery.py                        # 1 x 8 and 2 x 4 (8 workers: ~16 GB)
    MUJOCO_GL=egl python benchmarks/recovery.py --topologies 1x4,2x2

Per topology and round, one ``topo.collector`` run in a fresh process (``--case``), sync, random
actions, ``launch.restarts: {max: 1}``; the spec is ``benchmarks/specs/libero_1x8.yaml`` with its
topology and tasks changed. After ``--before`` batches, a random env worker is SIGKILLed between two
iterations; the loop goes on for ``--after`` batches after the restart collects. Rounds alternate the
topologies. Figures (median, min, max over the rounds):

- ``next_batch_s``: the kill to the next batch the loop got (sync: it needs the restarted subcollector);
  ``restarted_batch_s``: to the first batch after the run recorded the restart's first batch (the
  monitor reads records every 0.1 s: a little later); ``recover_s`` (the report's): the death, as the
  kernel timed it, to the restarted subcollector's first batch;
- a full relaunch of the same topology: ``relaunch_s`` = ``teardown_s`` (the run's shutdown) +
  ``process_to_first_batch_s`` (a new Python process started to its first batch: interpreter, imports,
  startup); ``launch_s``: ``topo.collector`` to the first batch (torch and torchrl imported within);
- the load average (1 min) before, during (max, sampled every 5 s) and after each run.

Results: ``benchmarks/results/recovery.json``. Run it under /work/heavy.lock, alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_SPEC = os.path.join(HERE, "specs", "libero_1x8.yaml")


def spec_for(topology: str) -> dict:
    subcollectors, workers = (int(x) for x in topology.split("x"))
    with open(BASE_SPEC) as f:
        spec = yaml.safe_load(f)
    n = subcollectors * workers
    spec["name"] = f"recovery-libero-{topology}"
    spec["topology"] = {"subcollectors": subcollectors, "workers_per_subcollector": workers}
    spec["assignment"]["tasks"] = f"0-{n - 1}"
    spec["collector"]["frames_per_batch"] = n
    spec["launch"]["restarts"] = {"max": 1}
    return spec


def run_case(topology: str, before: int, after: int, seed: int, spawned_at: float) -> dict:
    import topo

    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"topo-recovery-{topology}-{os.getpid()}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec_for(topology), f)
    subcollectors, workers = (int(x) for x in topology.split("x"))
    rng = random.Random(seed)
    victim = (rng.randrange(subcollectors), rng.randrange(workers))
    load = [os.getloadavg()[0]]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(5):
            load.append(os.getloadavg()[0])

    threading.Thread(target=sample, daemon=True).start()
    out: dict = {"topology": topology, "victim": {"subcollector": victim[0], "worker": victim[1]}}
    t0 = time.perf_counter()
    killed_at = back_at = None
    with topo.collector(path, progress=False, process_logs=True) as run:
        for i, batch in enumerate(run.collector):
            now = time.perf_counter()
            if i == 0:
                out["launch_s"] = now - t0
                out["process_to_first_batch_s"] = time.time() - spawned_at
            if killed_at is not None and "next_batch_s" not in out:
                out["next_batch_s"] = now - killed_at
            if killed_at is not None and back_at is None and all(r["outcome"] == "collecting" for r in run.restarts):
                back_at = i
                out["restarted_batch_s"] = now - killed_at
            if i + 1 == before:
                pid = run.state.workers[victim].pid
                os.kill(pid, signal.SIGKILL)
                killed_at = time.perf_counter()
                out["victim"]["pid"] = pid
            if back_at is not None and i >= back_at + after:
                break
    sampling.set()
    report = run.report.data
    (restart,) = report["restarts"]
    out.update(recover_s=restart["recover_s"], restart=restart, teardown_s=report["timings_s"].get("shutdown"),
               batches=report["launch"]["batches_per_subcollector"], exit_code=report["exit_code"],
               report_lines=[line.strip() for line in str(run.report).splitlines()
                             if line.strip().startswith("restart ")],
               left_behind=report["processes"]["left_behind"], alive_after=report["processes"]["alive_after"],
               load_average_1m={"before": round(load[0], 2), "max": round(max(load), 2),
                                "after": round(os.getloadavg()[0], 2)})
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topologies", default="1x8,2x4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=int, default=3, help="batches before the kill")
    parser.add_argument("--after", type=int, default=3, help="batches after the restart collects")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "recovery.json"))
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--spawned-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.before, args.after, args.seed, args.spawned_at)), flush=True)
        return
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    runs: dict[str, list[dict]] = {t: [] for t in args.topologies.split(",")}
    for round_ in range(args.rounds):  # rounds alternate the topologies, so drift hits both alike
        for topology in runs:
            done = subprocess.run([sys.executable, __file__, "--case", topology, "--before", str(args.before),
                                   "--after", str(args.after), "--seed", str(round_), "--spawned-at", str(time.time())],
                                  capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"{topology} failed:\n{done.stderr[-3000:]}")
            r = json.loads(done.stdout.strip().splitlines()[-1])
            r["relaunch_s"] = round(r["teardown_s"] + r["process_to_first_batch_s"], 3)
            runs[topology].append(r)
            print(f"{topology}: kill -> next batch {r['next_batch_s']}s (recover_s {r['recover_s']}); launch "
                  f"{r['launch_s']}s, relaunch {r['relaunch_s']}s; load {r['load_average_1m']}", flush=True)
    figures = ("next_batch_s", "restarted_batch_s", "recover_s", "launch_s", "process_to_first_batch_s", "teardown_s",
               "relaunch_s")
    summary = {t: {**{f: _spread([r[f] for r in rs]) for f in figures},
                   "relaunch_over_next_batch": round(statistics.median(r["relaunch_s"] for r in rs)
                                                     / statistics.median(r["next_batch_s"] for r in rs), 2),
                   "load_average_1m_max": max(r["load_average_1m"]["max"] for r in rs)} for t, rs in runs.items()}
    with open(args.out, "w") as f:
        json.dump({"machine": {"cores": os.cpu_count(), "mujoco_gl": env["MUJOCO_GL"]},
                   "env": "LIBERO libero_spatial, 64 px, software EGL, random actions, sync", "rounds": args.rounds,
                   "summary": summary, "runs": runs}, f, indent=1)
    for t, fig in summary.items():
        print(f"{t}: median kill -> next batch {fig['next_batch_s']['median']}s, relaunch {fig['relaunch_s']['median']}s")


def _spread(values: list) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


if __name__ == "__main__":
    main()
