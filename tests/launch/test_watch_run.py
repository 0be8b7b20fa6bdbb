"""``topo top`` and ``topo runs trace`` on a real toy run (1 x 2 workers, a policy, an eval section): while it
collects, `topo top --once` shows both workers; one worker is SIGKILLed and its subcollector restarts; the run
ends with an evaluation; its trace is valid Chrome trace JSON holding the startup phases of both lives, the
restart, the batches, the episodes and the evaluation round."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.launch.launch_helpers import (HANG_GUARD_S, LAUNCH_LIMITS, command, records, subprocess_env, summary,
                                         toy_spec, wait_for, write)

pytestmark = pytest.mark.slow


def topo(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topo", *map(str, args)], env=subprocess_env(), capture_output=True,
                          text=True, timeout=120)


def test_top_and_trace_of_a_run_with_a_restart_and_an_evaluation(tmp_path):
    data = toy_spec(1, 2, launch=dict(LAUNCH_LIMITS, restarts={"max": 1}))
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16,
                                                                         "state_dim": 8}}
    data["eval"] = {"tasks": [0, 1], "trials": 1, "workers": 2, "max_episode_steps": 6}
    report = tmp_path / "report"
    proc = subprocess.Popen(command(write(tmp_path / "spec.yaml", data), "--report", report, "--quiet",
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
