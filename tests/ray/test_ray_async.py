"""Async mode on Ray (the two-node cluster of tests/ray): one actor per node runs the async loop over its rows
(:mod:`topo.launch.ray.async_nodes`), the trainer's pushes reach both nodes' servers, a killed and a stopped env worker
on node_b are restarted by node_b's own run (named in the trainer's report), and a SIGKILLed trainer leaves nothing on
either node."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.launch.script_events import parse
from topo.launch.report import human
from tests.ray.ray_head_helpers import ENV, two_nodes
from tests.ray.test_ray_launch import alive, needs_ray
from tests.ray.test_ray_training import node_dirs, of_run

pytestmark = [pytest.mark.slow, needs_ray]
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
GUARD_S = 400
POLICY = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}


def async_spec(address: str) -> dict:
    return {
        "version": 1, "name": "toy-ray-async",
        "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": 2, "workers_per_subcollector": 2},
        "assignment": {"tasks": [0, 1], "instructions": {0: "push left", 1: "push right"},
                       "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 100}},
        "policy": POLICY,
        "placement": {"engine": "ray", "address": address, "resources": {"cpus": 1},
                      "overrides": [{"subcollectors": 0, "resources": {"custom": {"node_a": 1}}},
                                    {"subcollectors": 1, "resources": {"custom": {"node_b": 1}}}]},
        "collector": {"mode": "async", "frames_per_batch": 8},
        "launch": {"startup_timeout": 180, "shutdown_timeout": 60, "restarts": {"max": 2}, "hang_timeout": 5},
    }


@pytest.fixture(scope="module")
def cluster():
    with two_nodes() as (head, _):
        yield head


def start(tmp: Path, address: str, *args: str) -> subprocess.Popen:
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(async_spec(address), sort_keys=False))
    return subprocess.Popen([sys.executable, str(HERE / "async_ray_trainer.py"), str(spec), str(tmp / "report"), *args],
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "launch")])})


def test_async_on_two_nodes_batches_pushes_and_a_killed_and_a_stopped_worker_on_node_b_restarted(cluster, tmp_path):
    """Batches from both nodes, every push applied by both servers (their versions), steps stamped with versions that
    grow. On node_b, env worker 1 of subcollector 1 SIGKILLed after the first batch, then worker 0 of its restart
    SIGSTOPped (left stopped) once it stepped: node_b's run names each (``worker-died``, then ``worker-hung`` past
    ``hang_timeout``, by pid) and restarts the rows (lives 1, 2) while the trainer's loop goes on. The trainer's report
    holds both node runs as one machine's report would (their restarts, env closes, worker pids, nothing alive after),
    their records in its run directory."""
    proc = start(tmp_path, cluster.address, "400", "faults")
    try:
        events = list(parse(proc.stdout))
        proc.wait(GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = proc.stderr.read()
    t_end = time.time()
    assert proc.returncode == 0, stderr[-3000:]
    assert [e for e in events if e["event"] == "launch-error"] == []
    batches = [e for e in events if e["event"] == "batch"]
    lives = {tuple(life) for b in batches for life in b["lives"]}
    assert {c for c, _, _ in lives} == {0, 1}  # both nodes
    assert {(1, 0, 2), (1, 1, 2)} <= lives  # node_b's rows restarted twice
    pushes = [e for e in events if e["event"] == "pushed"]
    assert all(p["servers"] == [p["version"], p["version"]] for p in pushes)  # each push reached both servers
    assert max(v for b in batches for v in b["versions"]) > 0
    (after,) = [e for e in events if e["event"] == "after"]
    s = after["report"]
    assert s["ok"] and s["policy"]["updates"] == len(pushes)
    assert [(n["subcollectors"], n["ok"], n["restarts"], n["alive_after"]) for n in s["nodes"]] == [
        ([0], True, 0, 0), ([1], True, 2, 0)]
    (killed,) = [e["pid"] for e in events if e["event"] == "killed"]
    (stopped,) = [e["pid"] for e in events if e["event"] == "stopped"]
    node_b = s["nodes"][1]["node_id"][:12]
    assert [(r["node"], r["subcollector"], r["restart"], r["cause"]["kind"], r["cause"]["worker"], r["cause"]["pid"])
            for r in s["restarts"]] == [(node_b, 1, 1, "worker-died", 1, killed), (node_b, 1, 2, "worker-hung", 0, stopped)]
    assert "stopped" in s["restarts"][1]["cause"]["message"]
    text = human(s)
    assert f"restart 2 of sub1 on node {node_b}" in text and f"node {node_b} (" in text, text
    assert s["env_closes"]["constructed"] == 4 + 2 + 2 and s["processes"]["alive_after"] == []
    assert None not in s["processes"]["worker_pids"] and stopped not in s["processes"]["worker_pids"]
    pulled = sorted(p.parent.parent.name for p in Path(s["run_dir"], "nodes").glob("*/topo-run-*/summary.json"))
    assert len(pulled) == 2  # each node's run directory, with its report, pulled into the trainer's
    assert node_dirs(s["run_dir"]) == []  # removed on the nodes once pulled
    pids = {json.loads(m.read_text())["pid"] for m in Path(s["run_dir"], "nodes").glob("*/topo-run-*/markers/*.json")}
    assert len(pids) >= 10 and alive(pids, t_end) == []


def test_a_sigkilled_async_trainer_leaves_nothing_on_either_node(cluster, tmp_path):
    """The trainer SIGKILLed after its first push: Ray ends its node actors, each actor's watcher ends what its run
    started (env workers, server, forkserver): no process of the run is left on either node."""
    proc = start(tmp_path, cluster.address, "1000")
    run_dir = None
    try:
        for event in parse(proc.stdout):
            if event["event"] == "ready":
                run_dir, nodes = event["run_dir"], event["nodes"]
            if event["event"] == "pushed":
                break
        time.sleep(3)  # a pull of the node records: every env worker's marker in the trainer's run directory
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.time()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    pids = {json.loads(m.read_text())["pid"] for m in Path(run_dir, "nodes").glob("*/topo-run-*/markers/*.json")}
    pids |= {n["pid"] for n in nodes}
    assert len(pids) >= 2 + 4 + 2  # 2 actors, 4 env workers, 2 servers
    deadline = time.monotonic() + 90
    while (alive(pids, killed) or of_run(run_dir)) and time.monotonic() < deadline:
        time.sleep(1)
    assert alive(pids, killed) == []
    assert of_run(run_dir) == []
    for directory in node_dirs(run_dir):
        shutil.rmtree(directory)
