"""``topo top`` and ``topo runs trace`` on a real toy run (1 x 2 workers, a policy, an eval section): while it
collects, `topo top --once` shows both workers; one worker is SIGKILLed and its subcollector restarts; the run
ends with an evaluation; its trace is valid Chrome trace JSON holding the startup phases of both lives, the
restart, the batches, the episodes and the evaluation round. And a topology of 64 workers (a cheap env: torchrl's
``ToyVLAEnv``, 4 x 16), watched from start to end: 64 rows every time; one worker shows as hung before its
subcollector restarts, another's subcollector as recycled while it is rebuilt."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests import preimported
from tests.launch.launch_helpers import (HANG_GUARD_S, LAUNCH_LIMITS, alive, command, records, started_pids,
                                         subprocess_env, summary, toy_spec, user_spec, wait_for, write)

pytestmark = pytest.mark.slow


def topo(*args) -> subprocess.CompletedProcess:
    return preimported.run([sys.executable, "-m", "topo", *map(str, args)], env=subprocess_env(), capture_output=True,
                           text=True, timeout=120)


def test_top_and_trace_of_a_run_with_a_restart_and_an_evaluation(tmp_path):
    """Long: one real run with a SIGKILLed worker's restart and an eval process after its batches, then
    `topo top` and `topo runs trace` of it, each a fresh process."""
    data = toy_spec(1, 2, launch=dict(LAUNCH_LIMITS, restarts={"max": 1}))
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16,
                                                                         "state_dim": 8}}
    data["eval"] = {"tasks": [0, 1], "trials": 1, "workers": 2, "max_episode_steps": 6}
    report = tmp_path / "report"
    proc = preimported.popen(command(write(tmp_path / "spec.yaml", data), "--report", report, "--quiet",
                                    "--batches", 60), env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (report.exists() and records(report, "observed")), what="a batch")
        (victim,) = [m["pid"] for m in records(report, "markers")
                     if m["name"] == "constructed" and m["worker"]["index"] == 1]
        os.kill(victim, signal.SIGKILL)
        shown = json.loads(topo("top", report, "--once", "--format", "json").stdout)
        assert [(r["subcollector"], r["worker"]) for r in shown["rows"]] == [(0, 0), (0, 1)]
        assert shown["header"]["running"] and shown["header"]["workers"] == 2
        _, stderr = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    s = summary(report)
    assert len(s["restarts"]) == 1
    after = json.loads(topo("top", report, "--once", "--format", "json").stdout)
    assert not after["header"]["running"] and after["header"]["restarts"] == 1
    assert [(r["restart"], r["restarts"], r["state"]) for r in after["rows"]] == [(1, 1, "closed"), (1, 1, "closed")]

    done = topo("runs", "trace", report, "-o", tmp_path / "trace.json")
    assert done.returncode == 0, done.stderr
    found = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    for e in found:
        assert {"ph", "name", "pid", "tid"} <= set(e) and e["ph"] in ("X", "i", "M"), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] >= 0, e
    spans = [(e["name"], e["pid"], e["tid"], e["args"].get("restart")) for e in found if e["ph"] == "X"]
    for life in (0, 1):
        for w in (0, 1):
            assert ("build", 1, 1 + w, life) in spans and ("first reset", 1, 1 + w, life) in spans
    assert ("restart 1", 1, 0, None) in spans
    assert any(name.startswith("batch ") and pid == 1 for name, pid, _, _ in spans)
    assert any(name.startswith("w1-r1-e") for name, *_ in spans)  # an episode of the restarted life
    assert any(name == "evaluation round 1" and pid == 0 for name, pid, _, _ in spans)
    assert any(name.startswith("eval-w") and pid == 1001 for name, pid, _, _ in spans)  # the eval run's episodes
    (restart,) = [e for e in found if e["ph"] == "i" and e["name"].startswith("restart")]
    assert restart["name"] == "restart 1 of subcollector 0: worker-died" and restart["args"]["worker"] == 1


def test_topo_top_of_64_workers_shows_each_one_hung_before_its_restart_and_recycled_while_rebuilt(tmp_path):
    """Row 40 (subcollector 2, worker 8) hangs in its 31st step (hang_timeout 10: hung from 5 s in one step, the
    restart at 10 s); row 19 (subcollector 1, worker 3) ends an episode every 5 steps, past launch.recycle's
    max_episodes 4. A rebuilt worker takes 3 s to build (``rebuild_s``): forked from the run's forkserver, a rebuild
    is otherwise over before ``topo top`` looks again. --force: the memory check reads a callable backend's declared
    0.4 GB a worker; a ToyVLAEnv worker holds far less."""
    data = user_spec("unhealthy:unhealthy", 4, 16, step_ms=20, short_seed=19, episode_steps=5, hang_seed=40,
                     hang_after=30, rebuild_s=3)
    data["launch"].update(hang_timeout=10, restarts={"max": 1}, recycle={"max_episodes": 4})
    report = tmp_path / "report"
    proc = preimported.popen(command(write(tmp_path / "spec.yaml", data), "--report", report, "--quiet", "--force",
                                    "--batches", 60), env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    seen: dict[tuple[int, int], list[str]] = {}  # each worker's states, in the order top showed them
    hung_before_restart = False
    try:
        wait_for(lambda: (report / "summary.json").exists() or any(report.glob("topo-run-*/launch.json")),
                 what="the run directory")
        while proc.poll() is None:
            shown = topo("top", report, "--once", "--format", "json")
            if shown.returncode != 0:  # the run directory was being written: the next refresh reads it
                continue
            view = json.loads(shown.stdout)
            assert len(view["rows"]) == view["header"]["workers"] == 64
            for r in view["rows"]:
                states = seen.setdefault((r["subcollector"], r["worker"]), [])
                if not states or states[-1] != r["state"]:
                    states.append(r["state"])
            if view["header"]["restarts"] == 0 and "hung" in seen[(2, 8)]:
                hung_before_restart = True
            time.sleep(0.2)
        _, stderr = proc.communicate(timeout=HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    t_end = time.time()
    assert proc.returncode == 0, stderr
    assert hung_before_restart and seen[(2, 8)][seen[(2, 8)].index("hung") + 1] == "restarting", seen[(2, 8)]
    assert all("recycled" in seen[(1, w)] for w in range(16)), {w: seen[(1, w)] for w in range(16)}
    flagged = {k: states for k, states in seen.items() if "hung" in states or "dead" in states}
    assert set(flagged) == {(2, 8)}, flagged
    s = summary(report)
    assert [(r["subcollector"], r["cause"]["kind"], r["cause"]["worker"]) for r in s["restarts"]] == [(2, "worker-hung", 8)]
    assert [(r["subcollector"], r["row"]["global_index"]) for r in s["recycles"]] == [(1, 19)]
    table = topo("top", report, "--once")
    assert table.returncode == 0 and table.stdout.splitlines()[1].startswith("ended ok")
    rows = [line.split() for line in table.stdout.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert sorted(int(r[0]) for r in rows) == list(range(64)) and all("closed" in r for r in rows)
    assert alive(started_pids(report), t_end) == []

