"""``topo doctor`` on a Ray cluster, its pure parts without one: which subcollectors a node holds, the placement
checks, a node's memory estimate, the text and the JSON."""
from __future__ import annotations

import json

from click.testing import CliRunner
import yaml

import topo.doctor.cluster as doctor_ray
from topo.checks import FAIL, OK, WARN, Check
from topo.cli import main
from topo.doctor.cluster import NodeReport, check_auth, check_node_memory, check_placement, held, render_text

from tests.compiler.compiler_helpers import compile_dict
from tests.ray.test_ray_training import two_node_spec


def ray_plan(*custom: dict, workers: int = 2) -> dict:
    """The toy two-node plan with one subcollector per entry of ``custom`` (its custom resources)."""
    spec = two_node_spec("127.0.0.1:6379")
    spec["topology"].update(subcollectors=len(custom), workers_per_subcollector=workers)
    spec["collector"]["frames_per_batch"] = 8 * len(custom) * workers
    spec["placement"]["overrides"] = [{"subcollectors": i, "resources": {"custom": c}} for i, c in enumerate(custom) if c]
    return compile_dict(spec)


A, B = "a" * 56, "b" * 56


def test_a_node_holds_the_subcollectors_whose_custom_resources_it_has():
    plan = ray_plan({"node_a": 1}, {"node_b": 1}, {})
    assert held(plan, {"node_a": 1.0}) == [0, 2]  # 2 asks for nothing: any node
    assert held(plan, {"node_a": 1.0, "node_b": 2.0}) == [0, 1, 2]
    assert held(plan, {"node_a": 0.5}) == [2]  # less than asked
    assert held(plan, {}) == [2]


def test_a_cluster_that_lets_in_a_client_without_a_token_is_a_warning_naming_it_and_the_runbook():
    open_ = check_auth("10.0.0.1:6379", False)
    assert (open_.status, open_.detail) == (WARN, "the Ray cluster at 10.0.0.1:6379 lets in a client without a token: "
                                                  "anyone who reaches its port can join it as a node or run code on "
                                                  "every node")
    assert open_.hint == ("start every node with Ray's token authentication (RAY_AUTH_MODE=token and the token): "
                          "docs/guides/ray.md#who-may-join")
    unknown = check_auth("ray://10.0.0.1:10001", None)
    assert unknown.status == WARN and unknown.detail.startswith("could not tell whether the Ray cluster at "
                                                                "ray://10.0.0.1:10001 lets in a client without its token")
    assert "`RAY_AUTH_MODE=disabled ray status --address=ray://10.0.0.1:10001` must fail" in unknown.hint
    assert check_auth("auto", True) == Check("auth", OK, "the Ray cluster at auto refuses a client without its token")
    text = render_text("s.yaml", ray_plan({}), [], [open_]).splitlines()
    assert text[1:] == ["cluster:",
                        f"warn  auth  {open_.detail}",
                        f"            hint: {open_.hint}",
                        "ready to launch on the cluster (0 node(s)): 0 ok, 1 warning(s), 0 failure(s)"]  # exit 0


def test_placement_names_the_nodes_that_hold_each_subcollector_and_fails_one_that_none_holds():
    plan = ray_plan({"node_a": 1}, {"node_c": 1}, {}, {})
    checks = check_placement(plan, {A: ("host-a", {"node_a": 1.0}), B: ("host-b", {"node_b": 1.0})})
    assert [(c.status, c.detail) for c in checks] == [
        (OK, "subcollector 0 asks for node_a 1: node aaaaaaaaaaaa (host-a) has it"),
        (FAIL, "subcollector 1 asks for node_c 1: no node of the cluster has it"),
        (OK, "subcollectors 2, 3 ask for no custom resource: Ray may place them on any of the 2 node(s)")]
    assert """--resources='{"node_c": 1}'""" in checks[1].hint
    both = check_placement(ray_plan({"gpu": 1}), {A: ("host-a", {"gpu": 1.0}), B: ("host-b", {"gpu": 1.0})})
    assert both[0].detail.endswith("nodes aaaaaaaaaaaa (host-a), bbbbbbbbbbbb (host-b) have it")


def test_placement_names_the_node_that_holds_the_inference_servers_actor():
    spec = two_node_spec("127.0.0.1:6379")
    spec["policy"] = {"factory": "topo.policies.tinyvla:make", "placement": "server"}
    spec["placement"]["server"] = {"gpus": 1, "custom": {"learner": 1}}
    plan = compile_dict(spec)
    nodes = {A: ("host-a", {"node_a": 1.0}), B: ("host-b", {"node_b": 1.0})}
    last = check_placement(plan, nodes)[-1]
    assert (last.status, last.detail) == (FAIL, "the inference server asks for learner 1: no node of the cluster has it")
    assert last.hint.endswith("or ask for another resource (placement.server)")
    nodes[B] = ("host-b", {"node_b": 1.0, "learner": 1.0})
    last = check_placement(plan, nodes)[-1]
    assert (last.status, last.detail) == (OK, "the inference server asks for learner 1: node bbbbbbbbbbbb (host-b) has it")


def test_a_nodes_memory_counts_the_subcollectors_it_holds_and_those_that_may_land_anywhere():
    plan = ray_plan({"node_a": 1}, {"node_b": 1}, {}, workers=4)
    pinned = check_node_memory(plan, [0], 16.0)  # toy: 4 x 0.4 + 1 collector x 0.4
    assert pinned.status == OK
    assert pinned.detail == "~2.0 GB needed (4 workers x 0.4 GB + 1 collector processes x 0.4 GB), 16.0 GB available; " \
                            "for subcollector 0"
    anywhere = check_node_memory(plan, [1, 2], 16.0)
    assert "~4.0 GB needed (8 workers" in anywhere.detail
    assert anywhere.detail.endswith("for subcollectors 1, 2 (subcollector 2 asks for no custom resource: counted "
                                    "against every node)")
    assert check_node_memory(plan, [1, 2], 4.5).status == WARN
    short = check_node_memory(plan, [1, 2], 3.0)
    assert short.status == FAIL and "fits about 5 workers" in short.hint
    idle = check_node_memory(plan, [], 3.0)
    assert idle.status == OK and idle.detail == "the plan places no subcollector here, 3.0 GB available"


def nodes() -> list[NodeReport]:
    return [NodeReport(A, "host-a", {"node_a": 1.0}, [0], [Check("imports", OK, "imports"), Check("memory", OK, "fits")]),
            NodeReport(B, "host-b", {}, [], [Check("node", FAIL, "node bbbbbbbbbbbb on host-b did not answer in 5 s",
                                                   "--node-timeout")])]


def test_text_groups_the_checks_per_node_under_a_line_naming_it():
    plan = ray_plan({"node_a": 1}, {"node_c": 1})
    text = render_text("s.yaml", plan, nodes(), [Check("placement", OK, "sub 0 placed")]).splitlines()
    assert text == [
        "topo doctor s.yaml: backend toy, workers 2+2, Ray cluster at 127.0.0.1:6379, 2 alive node(s)",
        "cluster:",
        "ok    placement  sub 0 placed",
        "node aaaaaaaaaaaa on host-a (node_a 1): subcollector 0",
        "ok    imports    imports",
        "ok    memory     fits",
        "node bbbbbbbbbbbb on host-b (no custom resource): no subcollector",
        "FAIL  node       node bbbbbbbbbbbb on host-b did not answer in 5 s",
        "                 hint: --node-timeout",
        "cannot launch on the cluster: 3 ok, 0 warning(s), 1 failure(s)"]
    ready = render_text("s.yaml", plan, nodes()[:1], []).splitlines()
    assert ready[-1] == "ready to launch on the cluster (1 node(s)): 2 ok, 0 warning(s), 0 failure(s)"


def test_the_command_reports_every_node_in_json_and_exits_1_on_a_failure(tmp_path, monkeypatch):
    spec = tmp_path / "ray.yaml"
    spec.write_text(yaml.safe_dump(two_node_spec("127.0.0.1:6379")))
    found = {}
    monkeypatch.setattr(doctor_ray, "cluster_checks", lambda plan, timeout: (found.update(timeout=timeout) or nodes(), []))
    result = CliRunner().invoke(main, ["doctor", str(spec), "--format", "json", "--node-timeout", "7"])
    assert result.exit_code == 1 and found == {"timeout": 7.0}
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["checks"] == [] and report["spec"] == str(spec)
    assert [(n["node_id"], n["hostname"], n["resources"], n["subcollectors"]) for n in report["nodes"]] == [
        (A, "host-a", {"node_a": 1.0}, [0]), (B, "host-b", {}, [])]
    assert report["nodes"][1]["checks"] == [{"name": "node", "status": FAIL, "hint": "--node-timeout",
                                             "detail": "node bbbbbbbbbbbb on host-b did not answer in 5 s"}]
    monkeypatch.setattr(doctor_ray, "cluster_checks", lambda plan, timeout: (nodes()[:1], []))
    assert CliRunner().invoke(main, ["doctor", str(spec)]).exit_code == 0
