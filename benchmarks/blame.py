"""Exact blame: kill a random env worker, again and again; does topo name the one killed, every time?

    python benchmarks/blame.py                    # toy 2 x 3: 20 kills per worker start method, 10 launches
    python benchmarks/blame.py --kills 5 --launches 2

Two ways a kill ends, both on real torchrl processes (run it under /work/heavy.lock):

- restarts: one ``topo.collector`` run with ``launch.restarts`` (sync), per worker start method (fork,
  forkserver). A thread waits until every restart so far collects, waits a random 0-0.5 s (the kill
  lands mid-collection at a random point), SIGKILLs a random worker's current process; the loop goes
  on. At the end the report's restarts are compared with the kills, in order: subcollector, worker,
  pid, and "killed by SIGKILL".
- failures: ``--launches`` runs of ``topo launch`` without restarts (fork workers): after the first
  batch, a random worker is SIGKILLed; the launch must exit 1 naming that worker and its signal.

Results: ``benchmarks/results/blame.json`` (every kill, what was blamed, seconds to recover).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KILL_TIMEOUT_S = 240  # a restart not collecting this long after a kill: the benchmark fails


def spec(start_method: str, restarts: int) -> dict:
    return {"version": 1, "name": "blame-2x3", "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
            "topology": {"subcollectors": 2, "workers_per_subcollector": 3, "start_method": {"workers": start_method}},
            "assignment": {"tasks": [0, 1, 2], "instructions": {0: "push left", 1: "push right", 2: "lift"},
                           "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 0}},
            "launch": {"startup_timeout": 240, "restarts": {"max": restarts}}}


def with_restarts(start_method: str, kills: int, rng: random.Random, folder: str) -> dict:
    """One run, ``kills`` kills of a random worker, each restarted; the report's blame against them."""
    import topo

    path = os.path.join(folder, f"restarts-{start_method}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec(start_method, kills), f)
    killed: list[dict] = []
    done = threading.Event()

    def collecting(run, n: int) -> bool:
        restarts = run.restarts
        return len(restarts) == n and all(r["outcome"] == "collecting" for r in restarts)

    def killer(run) -> None:
        for k in range(kills):
            deadline = time.monotonic() + KILL_TIMEOUT_S
            while not collecting(run, k):
                if time.monotonic() > deadline:
                    return done.set()
                time.sleep(0.05)
            time.sleep(rng.uniform(0, 0.5))
            c, w = rng.randrange(2), rng.randrange(3)
            pid = run.state.workers[(c, w)].pid
            os.kill(pid, signal.SIGKILL)
            killed.append({"subcollector": c, "worker": w, "pid": pid, "at": time.time()})
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while not collecting(run, kills) and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()

    batches = 0
    with topo.collector(path, report_dir=os.path.join(folder, f"report-{start_method}"), progress=False,
                       process_logs=True) as run:
        thread = threading.Thread(target=killer, args=(run,), daemon=True)
        thread.start()
        for _ in run.collector:
            batches += 1
            if done.is_set():
                break
    thread.join()
    restarts = run.report.data["restarts"]
    blamed = [{"subcollector": r["cause"]["subcollector"], "worker": r["cause"]["worker"], "pid": r["cause"]["pid"],
               "how": r["cause"]["how"], "recover_s": r["recover_s"]} for r in restarts]
    exact = [b["how"] == "killed by SIGKILL" and (b["subcollector"], b["worker"], b["pid"]) ==
             (k["subcollector"], k["worker"], k["pid"]) for k, b in zip(killed, blamed)]
    recover = [b["recover_s"] for b in blamed if b["recover_s"] is not None]
    return {"start_method": start_method, "kills": len(killed), "restarts": len(restarts), "batches": batches,
            "exact": sum(exact), "all_exact": len(killed) == kills == len(blamed) and all(exact),
            "exit_code": run.report.data["exit_code"], "left_behind": run.report.data["processes"]["left_behind"],
            "recover_s": _stats(recover), "kills_and_blame": [{**k, "blamed": b} for k, b in zip(killed, blamed)]}


def without_restarts(launches: int, rng: random.Random, folder: str) -> dict:
    """``launches`` runs of ``topo launch`` (fork workers, no restarts), each killed once: exit 1, that worker named."""
    path = os.path.join(folder, "fail.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec("fork", 0), f)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    out = []
    for i in range(launches):
        report = os.path.join(folder, f"fail-{i}")
        proc = subprocess.Popen([sys.executable, "-m", "topo.launch", path, "--batches", str(10**9), "--report", report,
                                 "--quiet"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        run_dir = _wait(lambda: (glob.glob(os.path.join(report, "topo-run-*")) or [None])[0])
        _wait(lambda: glob.glob(os.path.join(run_dir, "observed", "*.json")))
        time.sleep(rng.uniform(0, 0.5))
        c, w = rng.randrange(2), rng.randrange(3)
        pid = next(m["pid"] for m in _markers(run_dir) if m["name"] == "constructed"
                   and (m["worker"]["subcollector"], m["worker"]["index"]) == (c, w))
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=KILL_TIMEOUT_S)
        with open(os.path.join(report, "summary.json")) as f:
            s = json.load(f)
        failure = s["error"]["failure"] or {}
        blamed = {"subcollector": failure.get("subcollector"), "worker": failure.get("worker"),
                  "pid": failure.get("pid"), "how": failure.get("how")}
        out.append({"killed": {"subcollector": c, "worker": w, "pid": pid}, "blamed": blamed,
                    "exit_code": proc.returncode, "left_behind": s["processes"]["left_behind"],
                    "exact": proc.returncode == 1 and blamed == {"subcollector": c, "worker": w, "pid": pid,
                                                                 "how": "killed by SIGKILL"}})
    return {"launches": launches, "exact": sum(r["exact"] for r in out), "all_exact": all(r["exact"] for r in out),
            "runs": out}


def _markers(run_dir: str) -> list[dict]:
    out = []
    for file in glob.glob(os.path.join(run_dir, "markers", "*.json")):
        try:
            with open(file) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


def _wait(predicate, timeout: float = KILL_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError("the launch did not get there")


def _stats(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20, help="kills per worker start method, in one run each")
    parser.add_argument("--start-methods", default="fork,forkserver")
    parser.add_argument("--launches", type=int, default=10, help="launches without restarts, one kill each")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "blame.json"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="topo-blame-") as folder:
        restarts = [with_restarts(m, args.kills, rng, folder) for m in args.start_methods.split(",")]
        failures = without_restarts(args.launches, rng, folder) if args.launches else None
    result = {"machine": {"cores": os.cpu_count(), "load_average_1m_at_end": round(os.getloadavg()[0], 2)},
              "topology": "toy 2 x 3", "seed": args.seed, "seconds": round(time.time() - started, 1),
              "with_restarts": restarts, "without_restarts": failures,
              "all_exact": all(r["all_exact"] for r in restarts) and (failures is None or failures["all_exact"])}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    summary = "; ".join(f"{r['start_method']}: {r['exact']}/{r['kills']} exact" for r in restarts)
    if failures:
        summary += f"; topo launch without restarts: {failures['exact']}/{failures['launches']} exact"
    print(f"{summary} ({result['seconds']}s) -> {args.out}")
    sys.exit(0 if result["all_exact"] else 1)


if __name__ == "__main__":
    main()
