"""``topo top`` refresh time on 1,000 simulated workers (issue 32): a run directory written as a run writes it
(125 subcollectors x 8 workers: markers, heartbeat slots, episode files with 20 episodes each, batch records),
then refreshes while a writer moves it on (every slot stamped, one worker in ten ends an episode and begins one).

    .venv/bin/python benchmarks/top_refresh.py   # writes benchmarks/results/top_refresh.json
Target: a refresh (read + view + table) <= 1 s for 1,000 workers. Also the whole `topo top --once --format json`
process (Python start, imports, the first full read).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

import topo
from topo.runtime import heartbeat
from topo.runtime.live import Reader, view
from topo.compiler.load import parse
from topo.runtime.rundir import HOST, RunDir
from topo.runs.top import render, select

ROOT = Path(__file__).resolve().parents[1]
SUBS, PER_SUB, EPISODES, REFRESHES = 125, 8, 20, 10
SPEC = {"version": 1, "name": "toy-125x8", "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": SUBS, "workers_per_subcollector": PER_SUB},
        "assignment": {"tasks": "0-9", "seeds": {"base": 0}}, "launch": {"stall_timeout": 60, "hang_timeout": 30}}
BLOB = "x" * 2000  # a start record's seed state (the RNGs' pickles, base64), about its real size


def simulate(path: str, plan: dict) -> None:
    with open(os.path.join(path, "launch.json"), "w") as f:
        json.dump({"plan": plan}, f)
    run, now, pid = RunDir(path), time.time(), os.getpid()
    os.makedirs(os.path.join(path, "episodes"))
    for sub in plan["subcollectors"]:
        c = sub["index"]
        run.add("markers", {"name": "subcollector", "pid": pid, "host": HOST, "time": now - 100, "restart": 0,
                            "index": c, "start_method": "spawn"})
        for row in sub["workers"]:
            where = {"subcollector": c, "index": row["index"], "global_index": row["global_index"]}
            for name in ("started", "constructed"):
                run.add("markers", {"name": name, "pid": pid, "host": HOST, "time": now - 90, "restart": 0,
                                    "worker": where, "seed": row["seed"], "seconds": 3.0})
            with open(os.path.join(path, "episodes", f"w{row['global_index']}.r0.jsonl"), "w") as f:
                for e in range(EPISODES):
                    f.write(json.dumps({"event": "start", "id": f"w{row['global_index']}-r0-e{e}", "time": now - 80 + e,
                                        "state": {"torch": BLOB}}) + "\n")
                    f.write(json.dumps({"event": "end", "id": f"w{row['global_index']}-r0-e{e}", "time": now - 79 + e,
                                        "steps": 4, "how": "terminated"}) + "\n")
        run.put("observed", f"sub{c}", subcollector=c, batches=100, first_time=now - 80, policy_versions=[3])
    stamp(path, plan, 0)


def stamp(path: str, plan: dict, k: int) -> None:
    """A refresh's worth of run: every slot stamped again, one worker in ten ending an episode and beginning one."""
    now = time.time()
    for sub in plan["subcollectors"]:
        slots = [(now - 0.5, now - 1.0, 0.0, 0, 0, 0, 0, 0.0, 0.0, 0)]
        slots += [(now - 0.01, now - 0.02, now, os.getpid(), 300 << 20, 310 << 20, 100 + k, 0.01, 0.01, EPISODES)
                  for _ in sub["workers"]]
        tmp = heartbeat.path(path, sub["index"], 0) + ".tmp"
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
        with open(tmp, "wb") as f:
            for s in slots:
                f.write(heartbeat.SLOT.pack(*s).ljust(heartbeat.STRIDE, b"\0"))
        os.replace(tmp, heartbeat.path(path, sub["index"], 0))
        for row in sub["workers"][k % 10::10]:
            gi, e = row["global_index"], EPISODES + k
            with open(os.path.join(path, "episodes", f"w{gi}.r0.jsonl"), "a") as f:
                f.write(json.dumps({"event": "end", "id": f"w{gi}-r0-e{e - 1}", "time": now, "steps": 4,
                                    "how": "terminated"}) + "\n")
                f.write(json.dumps({"event": "start", "id": f"w{gi}-r0-e{e}", "time": now, "state": {"torch": BLOB}})
                        + "\n")


def refresh(reader: Reader, previous):
    current = view(reader.read(), previous)
    render(select(current, (), (), (), "row", None))
    return current


def main() -> None:
    plan = topo.compile_source(parse(yaml.safe_dump(SPEC), "toy-125x8.yaml"))
    with tempfile.TemporaryDirectory(prefix="topo-run-bench-") as path:
        start = time.perf_counter()
        simulate(path, plan)
        written_s = time.perf_counter() - start
        start = time.perf_counter()
        reader = Reader(path)
        current = refresh(reader, None)
        first_s = time.perf_counter() - start
        assert len(current.rows) == SUBS * PER_SUB and current.header["states"] == {"stepping": SUBS * PER_SUB}
        times = []
        for k in range(1, REFRESHES + 1):
            stamp(path, plan, k)
            start = time.perf_counter()
            current = refresh(reader, current)
            times.append(time.perf_counter() - start)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "topo", "top", path, "--once", "--format", "json"],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        process_s = time.perf_counter() - start
        assert done.returncode == 0, done.stderr
        assert len(json.loads(done.stdout)["rows"]) == SUBS * PER_SUB
    result = {"workers": SUBS * PER_SUB, "subcollectors": SUBS, "episodes_per_worker": EPISODES,
              "simulated_in_s": round(written_s, 3), "first_refresh_s": round(first_s, 4),
              "refresh_s": {"median": round(statistics.median(times), 4), "max": round(max(times), 4),
                            "refreshes": REFRESHES},
              "topo_top_once_process_s": round(process_s, 3), "target_s": 1.0,
              "meets_target": max(times) <= 1.0 and first_s <= 1.0,
              "host": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "load_1m": round(os.getloadavg()[0], 2)}}
    out = ROOT / "benchmarks" / "results" / "top_refresh.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
