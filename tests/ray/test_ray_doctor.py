"""``topo doctor`` with ``placement.engine: ray`` on a real two-node cluster on this host (a head holding ``node_a``,
a second node holding ``node_b``): the checks run on each node, a resource no node has fails, and so does an
address where no cluster listens."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.ray.ray_head_helpers import ENV, free_port, two_nodes
from tests.ray.test_ray_launch import needs_ray
from tests.ray.test_ray_training import two_node_spec

pytestmark = [pytest.mark.slow, needs_ray]
ROOT = Path(__file__).resolve().parent.parent.parent
HANG_GUARD_S = 300


@pytest.fixture(scope="module")
def cluster():
    with two_nodes() as (head, _):
        yield head


def doctor(tmp_path: Path, spec: dict, *args: str, env: dict = ENV) -> subprocess.CompletedProcess:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return subprocess.run([sys.executable, "-m", "topo", "doctor", str(path), *args], cwd=tmp_path, capture_output=True,
                          text=True, env={**env, "PYTHONPATH": str(ROOT)}, timeout=HANG_GUARD_S)


def test_every_node_runs_the_checks_for_the_subcollector_the_plan_puts_there(cluster, tmp_path):
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


def test_text_names_each_node_and_a_node_out_of_time_fails(cluster, tmp_path):
    text = doctor(tmp_path, two_node_spec(cluster.address))
    assert text.returncode == 0, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].endswith(f"Ray cluster at {cluster.address}, 2 alive node(s)") and lines[1] == "cluster:"
    assert [line.split(": ", 1)[1] for line in lines if line.startswith("node ")] == ["subcollector 0", "subcollector 1"]
    assert lines[-1].startswith("ready to launch on the cluster (2 node(s)): ")
    late = doctor(tmp_path, two_node_spec(cluster.address), "--node-timeout", "0.01")
    assert late.returncode == 1, late.stdout + late.stderr
    failed = [line for line in late.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 2 and all("did not answer in 0.01 s" in line for line in failed), late.stdout


def test_a_resource_no_node_has_fails_naming_the_subcollector(cluster, tmp_path):
    spec = two_node_spec(cluster.address)
    spec["placement"]["overrides"][1]["resources"]["custom"] = {"node_c": 1}
    result = doctor(tmp_path, spec)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAIL  placement  subcollector 1 asks for node_c 1: no node of the cluster has it" in result.stdout
    assert """hint: start a node that has it (`ray start --address=HEAD:6379 --resources='{"node_c": 1}'`)""" \
        in result.stdout
    assert "(node_b 1): no subcollector" in result.stdout  # node_b holds nothing now
    assert result.stdout.splitlines()[-1].startswith("cannot launch on the cluster")


def test_an_unreachable_cluster_is_exit_1_with_the_address_and_the_hint(tmp_path):
    address = f"127.0.0.1:{free_port()}"  # nothing listens on it
    result = doctor(tmp_path, two_node_spec(address))
    assert result.returncode == 1 and result.stdout == ""
    assert f"error: no Ray cluster at {address}" in result.stderr and "ray start --head" in result.stderr
    assert "Traceback" not in result.stderr
