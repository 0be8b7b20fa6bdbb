"""Placement on paper: per-subcollector requests, Ray remote configs, packing onto declared nodes."""
from __future__ import annotations

import yaml

import topo
from topo.compiler.load import parse
from topo.compiler.plan import compile_checked

GB = 1024**3


def compile_dict(data: dict) -> tuple[dict | None, list]:
    source = parse(yaml.safe_dump(data), "spec.yaml")
    checked = topo.validate(source)
    plan = None if checked.errors else compile_checked(source, checked)
    return plan, checked.diagnostics


def toy(placement: dict, subcollectors: int = 4) -> dict:
    return {"version": 1, "env": {"backend": "toy"},
            "topology": {"subcollectors": subcollectors, "workers_per_subcollector": 2}, "placement": placement}


def test_the_ray_example_packs_one_actor_per_node():
    plan = topo.compile_spec("examples/libero_ray_10x32.yaml")
    entries = plan["placement"]["subcollectors"]
    assert plan["placement"]["engine"] == "ray" and plan["placement"]["address"] == "auto"
    assert entries[0]["remote_config"] == {"num_cpus": 33, "num_gpus": 1, "memory": 72 * GB,
                                           "resources": {"libero_node": 1}}
    assert [e["node"] for e in entries] == [f"gpu-node#{i}" for i in range(10)]  # 2 x 33 CPUs > 64


def test_overrides_apply_in_order_over_the_default():
    plan, diags = compile_dict(toy({"engine": "ray", "resources": {"cpus": 3, "custom": {"a": 1}},
                                    "overrides": [{"subcollectors": "1-2", "resources": {"cpus": 5}},
                                                  {"subcollectors": [2], "resources": {"gpus": 1, "custom": {"b": 2}}}]}))
    assert not [d for d in diags if d.is_error], diags
    configs = [e["remote_config"] for e in plan["placement"]["subcollectors"]]
    assert configs == [
        {"num_cpus": 3, "num_gpus": 0, "resources": {"a": 1}},
        {"num_cpus": 5, "num_gpus": 0, "resources": {"a": 1}},
        {"num_cpus": 5, "num_gpus": 1, "resources": {"a": 1, "b": 2}},
        {"num_cpus": 3, "num_gpus": 0, "resources": {"a": 1}},
    ]


def test_packing_fills_nodes_first_fit_and_names_who_is_left_over():
    plan, diags = compile_dict(toy({"engine": "ray", "resources": {"cpus": 3},
                                    "nodes": [{"name": "n", "count": 2, "cpus": 6}]}))
    assert [e["node"] for e in plan["placement"]["subcollectors"]] == ["n#0", "n#0", "n#1", "n#1"]
    _, diags = compile_dict(toy({"engine": "ray", "resources": {"cpus": 3},
                                 "nodes": [{"name": "n", "count": 2, "cpus": 5}]}))
    [d] = diags
    assert d.code == "placement-unsatisfiable"
    assert "subcollector(s) 2-3 fit on no node" in d.message and "cpus 12 asked / 10 declared" in d.message


def test_oversubscribed_cpus_warn_once_for_all_subcollectors():
    _, diags = compile_dict(toy({"engine": "ray", "resources": {"cpus": 1}}))
    [d] = diags
    assert (d.code, d.severity) == ("placement-cpus-oversubscribed", "warning")
    assert d.message.startswith("subcollectors 0-3 run 2 worker processes + 1 on 1 CPU(s)")


def test_local_engine_ignores_resources_with_a_warning():
    plan, diags = compile_dict(toy({"engine": "local", "resources": {"cpus": 4}}))
    assert [d.code for d in diags] == ["placement-ignored"]
    assert plan["placement"]["engine"] == "local"


def test_the_eval_runs_actors_are_packed_beside_the_trainings():
    """The eval run's actors (placement.resources each) and, with eval.policy: server, its own server's actor
    start while the training's hold their nodes: the declared nodes must hold them all."""
    def spec(nodes: int, policy: str, workers: int | None = None) -> dict:
        data = toy({"engine": "ray", "resources": {"cpus": 3}, "server": {"cpus": 2},
                    "nodes": [{"name": "n", "count": nodes, "cpus": 4}]}, subcollectors=2)
        data["assignment"] = {"tasks": [0, 1]}
        data["policy"] = {"factory": "topo.policies.tinyvla:make", "placement": "server"}
        data["eval"] = {"tasks": [2, 3], "policy": policy, **({"workers": workers} if workers else {})}
        return data

    def unsatisfiable(data: dict) -> list[str]:
        return [d.message for d in compile_dict(data)[1] if d.code == "eval-placement-unsatisfiable"]

    assert unsatisfiable(spec(4, "server")) == [] and unsatisfiable(spec(4, "copy")) == []
    [message] = unsatisfiable(spec(3, "server"))  # 2 x 3 + 2, then 3 + 2: 13 CPUs on 3 x 4
    assert message.startswith("the evaluation's 1 actor(s) (placement.resources each) and its own inference server's "
                              "actor (placement.server) fit on no declared node") and "cpus 13 asked / 12 declared" in message
    [message] = unsatisfiable(spec(3, "copy"))  # 11 CPUs, but an actor's 3 are on one node: 3 | 3 | 3, then 2
    assert "cpus 11 asked / 12 declared" in message
    [message] = unsatisfiable(spec(4, "copy", workers={"subcollectors": 2, "workers_per_subcollector": 1}))
    assert message.startswith("the evaluation's 2 actor(s) (placement.resources each) fit") and "cpus 14 asked / 16" in message
