"""Training across two Ray nodes on this host: ``topo.collector`` with ``placement.engine: ray``; and ``topo doctor`` on
the same cluster before any run (the checks run on each node, a resource no node has fails, and so does an address
where no cluster listens).

One cluster for the module (a head holding ``node_a`` and a second node holding ``node_b``, each ``ray start``
in its own process group) and one training run shared by the tests (``tests/launch/trainer.py``: TinyVLA,
a gradient step and a weight push per batch, and evaluation rounds on held-out tasks): sub0 is planned on node_a,
sub1 on node_b, records per node. A second run is SIGKILLed after its first weight update. Async mode on the same
cluster (``tests/ray/async_ray_trainer.py``): one actor per node, faults on node_b, a SIGKILLed trainer.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

from topo.launch.report import human
from topo.runtime.episodes import Episodes
from topo.launch.ray.records import NODE_RUNS
from topo.runtime.rundir import RunDir

from tests import preimported
from tests.launch.script_events import parse
from tests.launch.launch_helpers import assert_every_unclosed_env_is_named
from tests.libero.libero_helpers import needs_libero
from tests.ray.ray_head_helpers import ENV, free_port, two_nodes
from tests.ray.test_ray_launch import alive, needs_ray

pytestmark = [pytest.mark.slow, needs_ray]
TRAINER = Path(__file__).resolve().parent.parent / "launch" / "trainer.py"
ROOT = TRAINER.parent.parent.parent
HANG_GUARD_S = 240
DOCTOR_GUARD_S = 300
ASYNC_GUARD_S = 400
ASYNC_TRAINER = Path(__file__).resolve().parent / "async_ray_trainer.py"
ASYNC_POLICY = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}
ITERATIONS = 3


def two_node_spec(address: str) -> dict:
    return {
        "version": 1,
        "name": "toy-ray-2-nodes",
        "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": 2, "workers_per_subcollector": 2},  # topo's default: forkserver workers
        "assignment": {"tasks": [0, 1], "instructions": {0: "push left", 1: "push right"},
                       "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 100}},
        "placement": {"engine": "ray", "address": address, "resources": {"cpus": 1}, "run_dir": "per_node",
                      "overrides": [{"subcollectors": 0, "resources": {"custom": {"node_a": 1}}},
                                    {"subcollectors": 1, "resources": {"custom": {"node_b": 1}}}]},
        "collector": {"sync": True, "frames_per_batch": 8},
        "launch": {"startup_timeout": 180, "shutdown_timeout": 60},
    }


@pytest.fixture(scope="module")
def nodes():
    with two_nodes() as both:
        yield both


@pytest.fixture(scope="module")
def cluster(nodes):
    return nodes[0]


def start_trainer(tmp: Path, address: str, name: str, *args: str, spec_data: dict | None = None) -> subprocess.Popen:
    spec = tmp / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(spec_data or two_node_spec(address), sort_keys=False))
    return preimported.popen([sys.executable, str(TRAINER), str(spec), "--report", str(tmp / name),
                             "--iterations", str(ITERATIONS), *args], cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**ENV, "PYTHONPATH": str(ROOT)}, start_new_session=True)


def events_of(stdout):
    """The trainer's JSON events (Ray prints the actors' output on the same stdout)."""
    return parse(stdout)


def node_dirs(run_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(tempfile.gettempdir(), NODE_RUNS, os.path.basename(run_dir) + "-*")))


def look(report: Path) -> subprocess.CompletedProcess:
    return preimported.run([sys.executable, "-m", "topo", "top", str(report), "--once", "--format", "json"],
                           capture_output=True, text=True, env={**ENV, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)


def doctor(tmp_path: Path, spec: dict, *args: str, env: dict = ENV) -> subprocess.CompletedProcess:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return preimported.run([sys.executable, "-m", "topo", "doctor", str(path), *args], cwd=tmp_path, capture_output=True,
                           text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=DOCTOR_GUARD_S)


# topo doctor on the cluster, first: it reads the cluster as it stands before any run

def test_every_node_runs_the_checks_for_the_subcollector_the_plan_puts_there(cluster, tmp_path):
    """``topo doctor --format json``: each node runs the host checks for the subcollector the plan puts there. Its
    length: a doctor process, a Ray driver whose task on each node starts probes that import torch and torchrl."""
    result = doctor(tmp_path, two_node_spec(cluster.address), "--format", "json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["spec"].endswith("spec.yaml")
    nodes = report["nodes"]
    assert [(n["resources"], n["subcollectors"]) for n in nodes] == [({"node_a": 1.0}, [0]), ({"node_b": 1.0}, [1])]
    assert len({n["node_id"] for n in nodes}) == 2 and all(n["hostname"] for n in nodes)
    for n, sub in zip(nodes, (0, 1)):
        checks = {c["name"]: c for c in n["checks"]}
        assert {c["status"] for c in n["checks"]} == {"ok"}, n["checks"]
        assert {"backend", "imports", "torchrl", "memory"} <= set(checks)
        assert checks["memory"]["detail"].endswith(f"for subcollector {sub}")
        assert "(2 workers x 0.4 GB + 1 collector processes" in checks["memory"]["detail"]
    assert [c["detail"] for c in report["checks"]] == [
        f"the Ray cluster at {cluster.address} lets in a client without a token: anyone who reaches its port can join "
        "it as a node or run code on every node",  # a warning (exit 0): this test cluster runs without token auth
        f"subcollector 0 asks for node_a 1: node {nodes[0]['node_id'][:12]} ({nodes[0]['hostname']}) has it",
        f"subcollector 1 asks for node_b 1: node {nodes[1]['node_id'][:12]} ({nodes[1]['hostname']}) has it"]


def test_text_names_each_node_and_fails_a_resource_no_node_has_and_each_node_out_of_time_at_once(cluster, tmp_path):
    """Sub1 pinned to node_c, which no node has, and ``--node-timeout 0.01``: one text report with every problem, a
    FAIL naming the subcollector with the ``ray start`` hint and a FAIL per node that did not answer in time, each
    under a line naming its node and what it holds (the text of a report that passes: test_ray_doctor_units.py)."""
    spec = two_node_spec(cluster.address)
    spec["placement"]["overrides"][1]["resources"]["custom"] = {"node_c": 1}
    result = doctor(tmp_path, spec, "--node-timeout", "0.01")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith(f"Ray cluster at {cluster.address}, 2 alive node(s)") and lines[1] == "cluster:"
    assert "FAIL  placement  subcollector 1 asks for node_c 1: no node of the cluster has it" in lines
    assert """hint: start a node that has it (`ray start --address=HEAD:6379 --resources='{"node_c": 1}'`)""" \
        in result.stdout
    assert [line.split(" (", 1)[1] for line in lines if line.startswith("node ")] == [
        "node_a 1): subcollector 0", "node_b 1): no subcollector"]  # node_b holds nothing now
    failed = [line for line in lines if line.startswith("FAIL  node")]
    assert len(failed) == 2 and all("did not answer in 0.01 s" in line for line in failed), result.stdout
    assert lines[-1].startswith("cannot launch on the cluster")


def test_an_unreachable_cluster_is_exit_1_with_the_address_and_the_hint(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens on it
    result = doctor(tmp_path, two_node_spec(address))
    assert result.returncode == 1 and result.stdout == ""
    assert f"error: no Ray cluster at {address}" in result.stderr and "ray start --head" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def training(cluster, tmp_path_factory):
    """The shared run: its events, its summary, and the node run directories as they stood once it was ready. It
    evaluates too (its spec's eval section, ``--evaluate``): a round at update 2, then a blocking and two background
    ones after the loop."""
    tmp = tmp_path_factory.mktemp("ray-training")
    proc = start_trainer(tmp, cluster.address, "train", "--record-actions", "--hold", str(tmp / "looked"), "--evaluate",
                         spec_data=evaluated_spec(cluster.address))
    events, seen, top = [], {}, None
    try:
        for event in events_of(proc.stdout):
            events.append(event)
            if event["event"] == "ready":
                seen = {d: sorted(str(p.relative_to(d)) for p in Path(d).rglob("*.json")) for d in node_dirs(event["run_dir"])}
            # a live view, from another process, while the trainer holds at its first batch (the run lives on: no
            # view races its end); taken again while it shows a worker starting: a node's records reach the trainer
            # every PULL_EVERY_S, so a worker whose 'started' marker came in one pull starts until the next
            if event["event"] == "batch" and top is None:
                deadline = time.monotonic() + HANG_GUARD_S
                top = look(tmp / "train")
                while '"state": "starting"' in top.stdout and time.monotonic() < deadline:
                    top = look(tmp / "train")
                (tmp / "looked").touch()
        proc.wait(HANG_GUARD_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr
    (after,) = [e for e in events if e["event"] == "after"]
    return {"events": events, "summary": after["report"], "node_dirs": seen, "stderr": stderr, "ended": time.time(),
            "top": top, "evaluations": after["evaluations"]}


def evaluated_spec(address: str) -> dict:
    """The two-node spec with an eval section: eval.every 2, two held-out tasks, 2 eval workers."""
    data = two_node_spec(address)
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}
    data["eval"] = {"tasks": [2, 3], "trials": 1, "workers": 2, "max_episode_steps": 6, "every": 2}
    return data


def test_every_batch_acts_with_the_weights_pushed_last(training):
    batches = [e for e in training["events"] if e["event"] == "batch"]
    updates = [e["version"] for e in training["events"] if e["event"] == "update"]
    assert updates == [1, 2, 3]
    # batch i was collected after i pushes (the first: the trainer's weights, sent when the actors were ready)
    assert [b["versions"] for b in batches] == [[0], [1], [2]]
    assert all(b["shape"] == [2, 2, 2] and b["diff"] < 1e-5 for b in batches), batches
    policy = training["summary"]["policy"]
    assert policy["updates"] == 3 and policy["trainer_policy"] is True


def test_actors_run_on_the_nodes_the_plan_put_them(training):
    s = training["summary"]
    actors = s["actors"]
    assert [a["problems"] for a in actors] == [[], []]
    assert [a["actual"]["held"].get(f"node_{n}") for a, n in zip(actors, "ab")] == [1.0, 1.0]
    assert [a["actual"]["node_custom"] for a in actors] == [["node_a"], ["node_b"]]
    assert actors[0]["actual"]["node_id"] != actors[1]["actual"]["node_id"]
    assert [a["actual"]["pid"] for a in actors] == s["processes"]["subcollector_pids"]  # the actors said it themselves
    assert "actors, planned -> actual:" in training["stderr"] and "sub1: planned node_b 1 -> node" in training["stderr"]


def test_topo_top_shows_the_workers_of_both_nodes_while_the_run_lives(training):
    """``topo top --once`` from another process while the run lives (its trainer holds at its first batch): a row
    per worker, each naming the node its actor runs on (both nodes share this host: the node id tells them apart),
    each built and not dead."""
    top = training["top"]
    assert top.returncode == 0, top.stderr
    shown = json.loads(top.stdout)
    assert shown["header"]["running"] and shown["header"]["workers"] == 4
    nodes = [a["actual"]["node_id"][:12] for a in training["summary"]["actors"]]
    assert [(r["subcollector"], r["worker"], r["node"]) for r in shown["rows"]] == [
        (0, 0, nodes[0]), (0, 1, nodes[0]), (1, 0, nodes[1]), (1, 1, nodes[1])]
    assert all(r["state"] in ("ready", "stepping") for r in shown["rows"]), [
        {k: r[k] for k in ("state", "pid", "steps", "heartbeat_age_s", "step_s", "built_at")} for r in shown["rows"]]


def test_records_of_both_nodes_reach_the_report_without_a_shared_directory(training):
    s = training["summary"]
    run_dir = s["run_dir"]
    nodes = training["node_dirs"]
    # each node wrote in a directory of its own, not the trainer's, holding its subcollector's and workers' markers
    assert len(nodes) == 2 and run_dir not in nodes
    assert sorted(a["actual"]["run_dir"] for a in s["actors"]) == sorted(nodes)
    for directory, files in nodes.items():
        assert any(f.startswith("markers/subcollector.") for f in files)
        assert sum(f.startswith("markers/constructed.") for f in files) == 2
        assert set(files) <= {str(p.relative_to(run_dir)) for p in Path(run_dir).rglob("*.json")}  # pulled
    assert node_dirs(run_dir) == []  # removed once pulled at shutdown
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert s["env_closes"] == {"constructed": 4, "closed": 4}  # the closes: written at shutdown, pulled last
    assert s["seeds"] == {"checked": 4, "mismatches": []}
    assert None not in s["processes"]["worker_pids"] and None not in s["processes"]["subcollector_pids"]
    assert [e["status"] for e in s["first_batch"]] == ["ok", "ok"]
    assert s["launch"]["batches_per_subcollector"] == [ITERATIONS, ITERATIONS]
    p = s["processes"]
    assert alive(set(p["worker_pids"]) | set(p["subcollector_pids"]), training["ended"]) == []


def test_episodes_of_both_nodes_resolve_and_one_of_node_b_replays(training):
    """Provenance across nodes: each episode id of the batches resolves, from the records pulled through Ray, to
    its plan row and the versions that acted; an episode of node_b's worker replays here, bit for bit."""
    s = training["summary"]
    episodes = Episodes(s["run_dir"])
    seen: dict[int, set] = {}
    for batch in (e for e in training["events"] if e["event"] == "batch"):
        for value, version in batch["episodes"]:
            seen.setdefault(value, set()).add(version)
    assert {episodes.get(v).row["subcollector"] for v in seen} == {0, 1}
    for value, versions in seen.items():
        assert set(episodes.get(value).summary()["policy_versions"]) == versions
    on_b = next(e for e in episodes if not e.id.eval and e.row["subcollector"] == 1 and e.chunks)
    done = preimported.run([sys.executable, "-m", "topo", "replay", s["run_dir"], str(on_b.id), "--format", "json"],
                           capture_output=True, text=True, env={**ENV, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)
    out = json.loads(done.stdout)
    assert done.returncode == 0 and out["identical"] and out["steps"] > 0, (done.stdout, done.stderr[-2000:])


def test_a_sigkilled_trainer_leaves_no_process_of_its_run_on_any_node(cluster, tmp_path):
    """The trainer SIGKILLed after its first weight update: no process of its run is left on either node, and the
    node directories stay (no shutdown pulled them). Its length: a run's start (trainer, 2 actors, 4 env workers) and
    the wait for Ray and the actors' watchers to end them."""
    proc = start_trainer(tmp_path, cluster.address, "killed")
    run_dir = None
    try:
        for event in events_of(proc.stdout):
            if event["event"] == "ready":
                run_dir = event["run_dir"]
            if event["event"] == "update":
                break
        records = RunDir(run_dir).read_all("markers")
        pids = {r["pid"] for r in records if r["name"] in ("subcollector", "started", "constructed")}
        assert len(pids) == 6  # 2 actors, 4 env workers, all known to the trainer through the pulls
        os.kill(proc.pid, signal.SIGKILL)
        killed = time.time()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while (alive(pids, killed) or of_run(run_dir)) and time.monotonic() < deadline:
        time.sleep(1)
    assert alive(pids, killed) == []
    assert of_run(run_dir) == []  # nor any other process with the run's records in its environment
    assert len(node_dirs(run_dir)) == 2  # no shutdown pulled them: they stay on their nodes' disks
    for directory in node_dirs(run_dir):
        shutil.rmtree(directory)


def of_run(run_dir: str) -> list[str]:
    """The processes whose TOPO_RUN_DIR is the run's or one of its nodes' (pid and command line)."""
    prefixes = (run_dir, os.path.join(tempfile.gettempdir(), NODE_RUNS, os.path.basename(run_dir)))
    return [f"{p.pid} {' '.join(p.info['cmdline'] or [])[:200]}" for p in psutil.process_iter(["environ", "cmdline"])
            if (p.info["environ"] or {}).get("TOPO_RUN_DIR", "").startswith(prefixes)]


def test_an_actor_killed_on_node_b_is_named_and_the_run_torn_down(cluster, tmp_path):
    """On one host the monitor sees the actor's pid die (it is local) and names it first; across hosts, Ray's
    error is named with the actor's node and plan rows (``RayTopology.lost``, tests/ray/test_ray_units.py)."""
    proc = start_trainer(tmp_path, cluster.address, "victim", "--then", "kill-subcollector-then-update", "--victim", "1")
    events, stderr = to_the_end(proc)
    assert proc.returncode == 0, stderr
    assert [e["event"] for e in events if e["event"] in ("killed", "launch-error")] == ["killed", "launch-error"], (events, stderr)
    (killed,) = [e["pid"] for e in events if e["event"] == "killed"]
    (error,) = [e for e in events if e["event"] == "launch-error"]
    assert error["subcollector"] == 1 and error["exit_code"] == 1, error
    (after,) = [e for e in events if e["event"] == "after"]
    s = after["report"]
    assert s["processes"]["subcollector_pids"][1] == killed == s["actors"][1]["actual"]["pid"]  # node_b's actor
    assert s["exit_code"] == 1 and s["error"]["subcollector"] == 1
    assert s["processes"]["alive_after"] == []
    # node_a's directory was pulled and removed at shutdown; node_b's, its only actor dead, stays on its disk
    assert node_dirs(s["run_dir"]) == [s["actors"][1]["actual"]["run_dir"]]
    shutil.rmtree(s["actors"][1]["actual"]["run_dir"])


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def to_the_end(proc: subprocess.Popen, read=None, guard_s: float = HANG_GUARD_S, on_event=None
               ) -> tuple[list[dict], str]:
    """A started trainer's events read to its end (``read``: its stdout's parser, :func:`events_of` if None;
    ``on_event(event)`` sees each as it comes) and its stderr; its process group SIGKILLed past ``guard_s``."""
    events = []
    try:
        for event in (read or events_of)(proc.stdout):
            events.append(event)
            if on_event is not None:
                on_event(event)
        proc.wait(guard_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return events, proc.stderr.read()


def run_trainer(tmp: Path, address: str, name: str, *args: str, on_event=None,
                spec_data: dict | None = None) -> tuple[list[dict], dict]:
    """A trainer run to its end: its events and its report; ``on_event(event)`` sees each event as it comes."""
    proc = start_trainer(tmp, address, name, *args, spec_data=spec_data)
    events, stderr = to_the_end(proc, on_event=on_event)
    (tmp / f"{name}.stderr").write_text(stderr)
    assert proc.returncode == 0, stderr[-3000:]
    (after,) = [e for e in events if e["event"] == "after"]
    return events, after["report"]


def test_env_workers_killed_or_hung_on_node_b_are_restarted_from_their_plan_rows(cluster, tmp_path):
    """kill -9 of env worker 1 of subcollector 1 (node_b), then a SIGSTOP of worker 0 of its restart: each time the
    actor names the worker (dead; hung past hang_timeout, which it SIGKILLs), and its actor is made again on node_b
    with the same rows and the restart's seeds, starting from the weights pushed last; the loop gets every batch."""
    events, s = run_trainer(tmp_path, cluster.address, "restart", "--then", "kill-worker", "--restarts", "2",
                            "--hang-timeout", "5", "--stop-at", "2", "--iterations", "5")
    assert [e for e in events if e["event"] == "launch-error"] == []
    batches = [e for e in events if e["event"] == "batch"]
    assert [b["versions"] for b in batches] == [[v] for v in range(5)]  # restarted copies act with the pushed weights
    assert max(b["diff"] for b in batches) < 1e-5
    (killed,) = [e["pid"] for e in events if e["event"] == "killed"]
    (stopped,) = [e["pid"] for e in events if e["event"] == "stopped"]
    first, second = s["restarts"]
    assert [(r["subcollector"], r["restart"]) for r in (first, second)] == [(1, 1), (1, 2)]
    assert (first["cause"]["kind"], first["cause"]["worker"], first["cause"]["pid"], first["row"]["global_index"]) == (
        "worker-died", 1, killed, 3)
    node_b = s["actors"][1]["actual"]["node_id"][:12]
    assert first["cause"]["how"] == "killed by SIGKILL" and f"pid {killed} on " in first["cause"]["message"]
    assert f"(node {node_b})" in first["cause"]["message"]  # named by node_b's actor, not by a pid watched here
    assert (second["cause"]["kind"], second["cause"]["worker"], second["cause"]["pid"], second["row"]["global_index"]) \
        == ("worker-hung", 0, stopped, 2)
    assert "hang_timeout 5s" in second["cause"]["message"] and "its actor killed it" in second["cause"]["message"]
    assert first["seeds"] == {"planned": [106, 107], "applied": [106, 107]}  # seed + restart x 4 workers
    assert second["seeds"] == {"planned": [110, 111], "applied": [110, 111]}
    assert second["outcome"] == "collecting"
    for r in (first, second):
        assert r["started"]["subcollector"] not in (None, r["replaced"]["subcollector"])
        assert not set(r["started"]["workers"]) & set(r["replaced"]["workers"])
    assert killed in first["replaced"]["workers"] and stopped in second["replaced"]["workers"]
    actor = s["actors"][1]
    assert actor["actual"]["pid"] == second["started"]["subcollector"] and actor["planned"]["custom"] == {"node_b": 1}
    assert actor["problems"] == [] and actor["restart"] == 2
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 8}
    assert s["seeds"]["mismatches"] == [] and s["processes"]["alive_after"] == []
    assert_every_unclosed_env_is_named(s, {(1, 1, 0): "died (killed by SIGKILL)", (1, 0, 1): "hung (killed by SIGKILL)"},
                                       retired=[(1, 0, 0), (1, 1, 1)])


def served_spec(address: str) -> dict:
    """The two-node spec with policy.placement: server, the server's actor on node_b beside sub1."""
    data = two_node_spec(address)
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "placement": "server",
                      "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}
    data["placement"]["overrides"][1]["resources"]["custom"] = {"node_b": 0.9}  # node_b has 1: sub1 and the server share it
    data["placement"]["server"] = {"cpus": 1, "custom": {"node_b": 0.1}}
    return data


def test_the_inference_server_runs_as_a_ray_actor_on_the_node_the_plan_names(cluster, tmp_path):
    """policy.placement: server with placement.server on node_b: torchrl's InferenceServer (service_backend ray) is an
    actor there, both subcollectors' actors call it, every batch carries the version pushed last with the trainer's
    actions, sub1 restarted (env worker 1 killed) with a new client included; its record reaches the report through
    Ray; nothing of it is left after the run."""
    data = served_spec(cluster.address)
    events, s = run_trainer(tmp_path, cluster.address, "served", "--placement", "server", "--then", "kill-worker",
                            "--restarts", "1", spec_data=data)
    stderr = (tmp_path / "served.stderr").read_text()
    assert [e for e in events if e["event"] == "launch-error"] == []
    batches = [e for e in events if e["event"] == "batch"]
    assert [b["versions"] for b in batches] == [[0], [1], [2]]
    assert all(b["shape"] == [2, 2, 2] and b["diff"] < 1e-5 for b in batches), batches
    policy = s["policy"]
    assert (policy["placement"], policy["updates"], policy["trainer_policy"]) == ("server", 3, True)
    server = policy["server"]["actual"]
    assert policy["server"]["problems"] == [] and policy["server"]["planned"]["custom"] == {"node_b": 0.1}
    assert server["node_id"] == s["actors"][1]["actual"]["node_id"] != s["actors"][0]["actual"]["node_id"]  # node_b
    assert s["processes"]["server_pid"] == server["pid"] not in (s["processes"]["trainer_pid"], *s["processes"]["subcollector_pids"])
    (restart,) = s["restarts"]
    assert (restart["subcollector"], restart["cause"]["kind"], restart["outcome"]) == (1, "worker-died", "collecting")
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 6}
    assert s["processes"]["alive_after"] == []
    assert not psutil.pid_exists(server["pid"])
    assert "    server: planned node_b 0.1 -> node " in stderr


def test_a_killed_server_actor_ends_the_run_named_and_leaves_nothing(cluster, tmp_path):
    """kill -9 of the server's actor after the first batch: the subcollectors' clients wait on it forever, so the
    run fails (exit 1) naming the policy server, and its teardown ends every actor of the run."""
    data = served_spec(cluster.address)
    events, s = run_trainer(tmp_path, cluster.address, "server-killed", "--placement", "server", "--then", "kill-server",
                            "--iterations", "1000", spec_data=data)
    (killed,) = [e["pid"] for e in events if e["event"] == "killed"]
    (error,) = [e for e in events if e["event"] == "launch-error"]
    assert error["exit_code"] == 1 and error["subcollector"] is None
    assert error["message"].startswith("policy server ended unexpectedly"), error["message"]
    assert s["error"]["failure"]["kind"] == "server-died" and killed == s["policy"]["server"]["actual"]["pid"]
    assert len([e for e in events if e["event"] == "batch"]) < 1000
    assert s["processes"]["alive_after"] == [] and of_run(s["run_dir"]) == []


def test_evaluation_runs_its_held_out_episodes_on_the_cluster_too(training):
    """The shared run's eval section under engine ray: the eval process's collector is a Ray job of its own, one actor
    per eval subcollector asking for placement.resources (the overrides' pins are the training actors'), each round
    written on the actors' nodes; every planned eval episode ends once per round with that round's weights, and no
    process of either run is left."""
    # eval.every 2 (a round at update 2), then after the 3 updates a blocking round, then two background ones (the
    # second skipped: busy); each acted with the weights of its own round (the eval run's versions count its rounds)
    assert [(r["round"], r["policy_version"], r["acting_version"], r["episodes"], r["planned"])
            for r in training["evaluations"]] == [(1, 2, 1, 2, 2), (2, 3, 2, 2, 2), (3, 3, 3, 2, 2)]
    (asked,) = [e for e in training["events"] if e["event"] == "async"]
    assert asked["accepted"] == [True, False] and asked["rounds"] == 3
    s = training["summary"]
    collector = s["evaluation"]["collector"]
    assert collector["ok"] and collector["topology"]["engine"] == "ray", collector
    assert collector["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    assert collector["env_closes"] == {"constructed": 2, "closed": 2}
    assert s["processes"]["alive_after"] == [] and of_run(s["run_dir"]) == []


@pytest.mark.libero
@needs_libero
def test_tinyvla_trains_on_real_libero_across_both_nodes(cluster, tmp_path):
    """The CPU LIBERO example, one worker per subcollector, sub0 on node_a and sub1 on node_b: TinyVLA acts in each
    actor with the weights pushed last, every env is built in its worker on its node, and nothing is left."""
    data = yaml.safe_load((ROOT / "examples" / "libero_cpu.yaml").read_text())
    data["topology"]["workers_per_subcollector"] = 1
    data["assignment"].update(tasks=[0, 1], groups={"size": 1, "candidate_size": 2})
    data["collector"]["frames_per_batch"] = 2
    data["placement"] = two_node_spec(cluster.address)["placement"]
    events, s = run_trainer(tmp_path, cluster.address, "libero", "--max-frames-per-traj", "2", spec_data=data)
    assert [e for e in events if e["event"] == "launch-error"] == []
    batches = [e for e in events if e["event"] == "batch"]
    assert [b["versions"] for b in batches] == [[0], [1], [2]]
    assert max(b["diff"] for b in batches) < 1e-4  # the trainer's copy computes the actions the workers took
    assert [a["actual"]["node_custom"] for a in s["actors"]] == [["node_a"], ["node_b"]]
    assert all(a["problems"] == [] for a in s["actors"]) and s["policy"]["weight_sync"] == "ray"
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    assert s["env_closes"] == {"constructed": 2, "closed": 2} and s["seeds"]["mismatches"] == []
    assert [b["status"] for b in s["first_batch"]] == ["ok", "ok"]
    assert s["processes"]["alive_after"] == [] and of_run(s["run_dir"]) == []


# async mode on the cluster: one actor per node runs the async loop over its rows (topo.launch.ray.async_nodes), the
# trainer's pushes reach both nodes' servers, a killed and a stopped env worker on node_b are restarted by node_b's own
# run (named in the trainer's report), and a SIGKILLed trainer leaves nothing on either node

def async_spec(address: str) -> dict:
    return {
        "version": 1, "name": "toy-ray-async",
        "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": 2, "workers_per_subcollector": 2},
        "assignment": {"tasks": [0, 1], "instructions": {0: "push left", 1: "push right"},
                       "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 100}},
        "policy": ASYNC_POLICY,
        "placement": {"engine": "ray", "address": address, "resources": {"cpus": 1},
                      "overrides": [{"subcollectors": 0, "resources": {"custom": {"node_a": 1}}},
                                    {"subcollectors": 1, "resources": {"custom": {"node_b": 1}}}]},
        "collector": {"mode": "async", "frames_per_batch": 8},
        "launch": {"startup_timeout": 180, "shutdown_timeout": 60, "restarts": {"max": 2}, "hang_timeout": 5},
    }


def start_async(tmp: Path, address: str, *args: str) -> subprocess.Popen:
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(async_spec(address), sort_keys=False))
    return preimported.popen([sys.executable, str(ASYNC_TRAINER), str(spec), str(tmp / "report"), *args],
                             cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env={**ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "launch")])})


def test_async_on_two_nodes_batches_pushes_and_a_killed_and_a_stopped_worker_on_node_b_restarted(cluster, tmp_path):
    """Batches from both nodes, every push applied by both servers (their versions), steps stamped with versions that
    grow. On node_b, env worker 1 of subcollector 1 SIGKILLed after the first batch, then worker 0 of its restart
    SIGSTOPped (left stopped) once it stepped: node_b's run names each (``worker-died``, then ``worker-hung`` past
    ``hang_timeout``, by pid) and restarts the rows (lives 1, 2) while the trainer's loop goes on. The trainer's report
    holds both node runs as one machine's report would (their restarts, env closes, worker pids, nothing alive after),
    their records in its run directory."""
    proc = start_async(tmp_path, cluster.address, "400", "faults")
    events, stderr = to_the_end(proc, parse, ASYNC_GUARD_S)
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
    proc = start_async(tmp_path, cluster.address, "1000")
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


def test_a_lost_node_is_named_with_its_actors_and_plan_rows(nodes, tmp_path):
    """node_b's raylet killed mid-run: the run fails (exit 1) naming the node, its actor and plan rows (no node
    left can hold what the plan pins there), and leaves nothing on the node that is still up. The module's last
    test: node_b is gone after it."""
    head, node = nodes
    raylets = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "raylet" and _pgid(p) == node.proc.pid]
    assert len(raylets) == 1

    def kill_raylet(event):
        if event["event"] == "batch" and event["iteration"] == 0:
            raylets[0].kill()

    events, s = run_trainer(tmp_path, head.address, "lost", "--restarts", "1", "--iterations", "1000",
                            on_event=kill_raylet)
    (error,) = [e for e in events if e["event"] == "launch-error"]
    assert (error["subcollector"], error["exit_code"]) == (1, 1)
    node_b = s["actors"][1]["actual"]
    assert error["message"].startswith(f"node {node_b['hostname']} (node {node_b['node_id'][:12]}) was lost: it held "
                                       "subcollector 1's actor, env workers [2, 3] (global indices)"), error["message"]
    assert s["exit_code"] == 1 and s["error"]["subcollector"] == 1
    assert len([e for e in events if e["event"] == "batch"]) < 1000
    assert of_run(s["run_dir"]) == []
    for directory in node_dirs(s["run_dir"]):
        shutil.rmtree(directory)
