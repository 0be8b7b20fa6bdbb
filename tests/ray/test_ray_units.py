"""The Ray engine's pure parts, without a cluster: the placement check, the records pulled into the run
directory, the per-node run directory's place and the ``placement.run_dir`` field."""
from __future__ import annotations

import contextlib
import os

import pytest
import yaml

import topo
from topo.errors import LaunchError, SpecError
from topo.launch.ray import placement as ray_placement
from topo.launch.ray.records import node_run_dir, records_dir, write_files


def plan(custom: list[dict], gpus: float = 0) -> dict:
    subs = [{"resources": {"cpus": 1, "gpus": gpus, "memory_gb": None, "custom": c}, "node": None} for c in custom]
    return {"placement": {"subcollectors": subs}}


def actor(node: str, held: dict, gpu_ids=(), visible=None) -> dict:
    return {"node_id": node * 8, "hostname": f"host-{node}", "pid": 1, "assigned": held, "gpu_ids": list(gpu_ids),
            "cuda_visible_devices": visible, "run_dir": "/tmp/x"}


NODES = {"a" * 8: {"CPU": 2.0, "node_a": 1.0, "node:127.0.0.1": 1.0}, "b" * 8: {"CPU": 2.0, "node_b": 1.0}}


def test_actors_where_the_plan_put_them_pass_and_are_described():
    rows = ray_placement.compare(plan([{"node_a": 1}, {"node_b": 1}]),
                                 [actor("a", {"CPU": 1.0, "node_a": 1.0}), actor("b", {"CPU": 1.0, "node_b": 1.0})], NODES)
    ray_placement.verify(rows)
    assert [r["problems"] for r in rows] == [[], []]
    assert rows[1]["actual"]["node_custom"] == ["node_b"] and rows[1]["planned"]["custom"] == {"node_b": 1}
    assert "sub1: planned node_b 1 -> node bbbbbbbb on host-b" in ray_placement.describe(rows)[1]


def test_an_actor_without_its_planned_resource_is_a_launch_error_naming_its_subcollector():
    rows = ray_placement.compare(plan([{}, {"node_b": 1}]),
                                 [actor("a", {"CPU": 1.0}), actor("a", {"CPU": 1.0})], NODES)
    with pytest.raises(LaunchError) as err:
        ray_placement.verify(rows)
    assert err.value.subcollector == 1 and err.value.exit_code == 1
    assert str(err.value) == ("subcollector 1 is not where the plan put it: its actor on host-a (node aaaaaaaa) holds 0 "
                              "of resource 'node_b', planned 1; its node has no resource 'node_b'")


def test_gpus_not_the_ones_ray_assigned_are_a_mismatch():
    rows = ray_placement.compare(plan([{}], gpus=1), [actor("a", {"CPU": 1.0, "GPU": 1.0}, ["3"], visible="0")], NODES)
    assert rows[0]["problems"] == ["CUDA_VISIBLE_DEVICES=0 but Ray assigned GPU(s) 3"]
    rows = ray_placement.compare(plan([{}], gpus=1), [actor("a", {"CPU": 1.0})], NODES)
    assert rows[0]["problems"] == ["holds 0 GPU(s), planned 1"]


def test_pulled_files_land_at_their_place_in_the_run_directory_and_never_outside(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    known = {}
    n = write_files(str(run), [("markers/started.1.ab.json", 5, 2, b"{}", 0, 1),
                               ("beats/sub1.r0.bin", 6, 8, b"\0" * 8, 0, 2), ("../escaped.json", 7, 2, b"{}", 0, 3)], known)
    assert n == 2 and known == {"markers/started.1.ab.json": (5, 2, 1), "beats/sub1.r0.bin": (6, 8, 2)}
    assert (run / "markers/started.1.ab.json").read_bytes() == b"{}" and (run / "beats/sub1.r0.bin").stat().st_size == 8
    assert not (tmp_path / "escaped.json").exists()
    assert not [p for p in run.rglob("*.tmp")]
    # an episode file grows: its new bytes are appended; one that does not line up is forgotten, then sent whole
    life = "episodes/w3.r0.jsonl"
    assert write_files(str(run), [(life, 8, 6, b'{"a":1', 0, 4)], known) == 1
    assert write_files(str(run), [(life, 9, 10, b'}\n{}', 6, 4)], known) == 1 and known[life] == (9, 10, 4)
    assert (run / life).read_bytes() == b'{"a":1}\n{}'
    assert write_files(str(run), [(life, 10, 14, b"\n{}\n", 12, 4)], known) == 0 and life not in known


def test_a_node_sends_an_episode_file_s_new_bytes_only(tmp_path, monkeypatch):
    from topo.launch.ray.node import NodeCollector

    node = NodeCollector.__new__(NodeCollector)  # its file listing only: no Ray, no collector
    node._topo_run_dir = str(tmp_path)
    (tmp_path / "episodes").mkdir()
    (tmp_path / "episodes" / "w0.r0.jsonl").write_bytes(b"0123456789")
    (tmp_path / "observed.json").write_bytes(b"{}")
    life = tmp_path / "episodes" / "w0.r0.jsonl"
    first = {rel: (content, offset) for rel, _, _, content, offset, _ in node.topo_files({})}
    assert first == {"episodes/w0.r0.jsonl": (b"0123456789", 0), "observed.json": (b"{}", 0)}
    with open(life, "ab") as f:
        f.write(b"abc")
    known = {"episodes/w0.r0.jsonl": (1, 10, life.stat().st_ino), "observed.json": (2, 3, 0)}
    again = {rel: (content, offset) for rel, _, _, content, offset, _ in node.topo_files(known)}
    assert again == {"episodes/w0.r0.jsonl": (b"abc", 10), "observed.json": (b"{}", 0)}
    # retention rewrote it (another file under the same name), now longer than the trainer's copy: sent whole
    (tmp_path / "episodes" / "new").write_bytes(b"retained-0123456789")
    os.replace(tmp_path / "episodes" / "new", life)
    again = {rel: (content, offset) for rel, _, _, content, offset, _ in node.topo_files(known)}
    assert again["episodes/w0.r0.jsonl"] == (b"retained-0123456789", 0)


def test_a_node_sends_a_beats_file_each_time_as_its_mtime_lags_the_writes_through_its_map(tmp_path):
    """A worker stamps its beats slot through a memory map: the file's mtime, size and inode stay as the trainer
    knows them (until the kernel writes the page back) while its steps and times change."""
    import mmap

    from topo.launch.ray.node import NodeCollector
    from topo.runtime import heartbeat

    node = NodeCollector.__new__(NodeCollector)
    node._topo_run_dir = str(tmp_path)
    beats = tmp_path / heartbeat.path("", 0, 0)
    beats.parent.mkdir()
    beats.write_bytes(b"\0" * 16)
    st = beats.stat()
    known = {str(beats.relative_to(tmp_path)): (st.st_mtime_ns, st.st_size, st.st_ino)}
    with open(beats, "r+b") as f, mmap.mmap(f.fileno(), 0) as stamped:
        stamped[:4] = b"step"
    os.utime(beats, ns=(st.st_atime_ns, st.st_mtime_ns))  # as a write through a map leaves it, for a while
    sent = {rel: content for rel, _, _, content, _, _ in node.topo_files(known)}
    assert sent == {"beats/sub0.r0.bin": b"step" + b"\0" * 12}


def spec(tmp_path, **placement) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1, "name": "toy", "env": {"backend": "toy"},
        "topology": {"subcollectors": 2, "workers_per_subcollector": 1},
        "assignment": {"tasks": [0, 1], "instructions": {0: "a", 1: "b"}},
        "placement": {"engine": "ray", **placement}}))
    return str(path)


def test_run_dir_defaults_to_per_node_and_reaches_the_plan(tmp_path):
    assert topo.compile_spec(spec(tmp_path))["placement"]["run_dir"] == "per_node"
    assert topo.compile_spec(spec(tmp_path, run_dir="shared"))["placement"]["run_dir"] == "shared"


def test_an_unknown_run_dir_is_a_located_spec_error(tmp_path):
    with pytest.raises(SpecError) as err:
        topo.compile_spec(spec(tmp_path, run_dir="nfs"))
    assert err.value.exit_code == 2
    (diagnostic,) = [d for d in err.value.diagnostics if d.is_error]
    assert "placement" in diagnostic.format() and "run_dir" in diagnostic.format()


def test_the_node_run_directory_is_per_run_and_per_node():
    a, b = node_run_dir("/runs/topo-run-x", "a" * 40), node_run_dir("/runs/topo-run-x", "b" * 40)
    assert a != b and os.path.basename(a) == "topo-run-x-aaaaaaaaaaaa" and not a.startswith("/runs")


def test_a_dead_actor_is_named_with_its_node_and_plan_rows(monkeypatch):
    exceptions = pytest.importorskip("ray.exceptions")
    from types import SimpleNamespace

    from topo.launch.ray import engine as ray_collector
    from topo.launch.ray.engine import RayTopology

    actors = [SimpleNamespace(_actor_id=SimpleNamespace(hex=lambda i=i: f"actor{i}")) for i in range(2)]
    topology = RayTopology(SimpleNamespace(remote_collectors=actors), {"collector": {"total_frames": -1}, "subcollectors": [
        {"workers": [{"global_index": 0}, {"global_index": 1}]}, {"workers": [{"global_index": 2}, {"global_index": 3}]}]})
    topology.actor_placement = [{"actual": actor("a", {})}, {"actual": actor("b", {})}]
    err = topology.lost(exceptions.RayActorError(actor_id="actor1", error_msg="The actor died because its node has died."))
    assert err.subcollector == 1 and err.exit_code == 1
    assert str(err) == ("subcollector 1's Ray actor died on host-b (node bbbbbbbb), with env workers [2, 3] (global "
                        "indices): The actor died because its node has died.")
    monkeypatch.setattr(ray_collector, "_first_dead", lambda actors: None)  # every actor answers
    unknown = topology.lost(exceptions.RayActorError(actor_id="other", error_msg="gone"))
    assert unknown.subcollector is None and str(unknown) == "a Ray actor of this run died: gone"
    other = RuntimeError("not about an actor")
    assert topology.lost(other) is other


def test_records_go_to_the_node_or_to_a_shared_directory_this_node_must_see(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "node-tmp"))
    mine = records_dir({"run_dir": "/runs/topo-run-x", "mode": "per_node", "subcollector": 1}, "b" * 40, "host-b")
    assert mine == str(tmp_path / "node-tmp" / "topo-node-runs" / "topo-run-x-bbbbbbbbbbbb") and os.path.isdir(mine)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "launch.json").write_text("{}")
    assert records_dir({"run_dir": str(shared), "mode": "shared", "subcollector": 1}, "b" * 40, "host-b") == str(shared)
    with pytest.raises(LaunchError) as err:
        records_dir({"run_dir": "/not/mounted/here", "mode": "shared", "subcollector": 1}, "b" * 40, "host-b")
    assert err.value.subcollector == 1
    assert str(err.value).startswith("placement.run_dir is 'shared' but the run directory /not/mounted/here is not "
                                     "visible on node host-b (bbbbbbbbbbbb)")


def test_what_ray_raises_is_named_as_the_worker_the_actor_or_the_node_it_was(tmp_path, monkeypatch):
    """Across hosts only the actor sees its env workers' pids: its error names them; a dead actor is named with
    its node when the node is up, and a node the cluster lost with every actor it held."""
    exceptions = pytest.importorskip("ray.exceptions")
    from types import SimpleNamespace

    from tests.ray.test_ray_launch import toy_ray_spec
    from topo.launch.ray import engine as ray_collector
    from topo.launch.ray.node import EnvWorkersDied
    from topo.launch.supervision.state import RunState
    from topo.runtime.rundir import RunDir

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(toy_ray_spec("127.0.0.1:1")))
    compiled = topo.compile_spec(str(path))
    topology = ray_collector.RayTopology(SimpleNamespace(remote_collectors=[]), compiled)
    state = RunState(compiled, RunDir(str(tmp_path)), 0.0)
    topology.recovery = SimpleNamespace(blame=lambda build: build(state))
    topology.actor_placement = [{"actual": actor("b", {})}, {"actual": actor("b", {})}]
    died = exceptions.RayTaskError("next", "trace", EnvWorkersDied.of([(1, 4242, -9)], "EOFError: ", {}))
    found = topology._failure(1, died)
    assert (found.kind, found.subcollector, found.worker, found.row["global_index"], found.pid) == ("worker-died", 1, 1, 3, 4242)
    assert found.message == ("env worker died while collecting without a traceback (killed by SIGKILL, pid 4242 on "
                             "host-b (node bbbbbbbb))") and found.restartable
    for ended in (-15, 0, None):  # a sibling torchrl ended (or that had not yet exited) is not the cause
        died = exceptions.RayTaskError("next", "trace", EnvWorkersDied.of([(0, 4241, ended), (1, 4242, -9)], "EOFError: ", {}))
        assert (topology._failure(1, died).worker, topology._failure(1, died).pid) == (1, 4242)
    state.plan["launch"]["hang_timeout"] = 5
    died = exceptions.RayTaskError("next", "trace", EnvWorkersDied.of([(0, 4241, -9), (1, 4242, -9)], "", {1: 6.0}))
    assert (topology._failure(1, died).kind, topology._failure(1, died).worker) == ("worker-hung", 1)  # the hung one
    monkeypatch.setattr(ray_collector, "_node_alive", lambda node: True)
    found = topology._failure(0, exceptions.RayTaskError("next", "Traceback ...\nValueError: bad shape",
                                                         ValueError("bad shape")))
    assert (found.kind, found.subcollector, found.restartable) == ("subcollector-failed", 0, True)
    assert found.message == "subcollector 0's Ray actor failed on host-b (node bbbbbbbb): bad shape"
    found = topology._failure(1, exceptions.RayActorError(error_msg="killed by ray.kill"))
    assert (found.kind, found.restartable) == ("subcollector-died", True)
    assert found.message == ("subcollector 1's Ray actor died on host-b (node bbbbbbbb), with env workers [2, 3] (global "
                             "indices): killed by ray.kill")
    monkeypatch.setattr(ray_collector, "_node_alive", lambda node: False)
    monkeypatch.setattr(ray_collector, "_placeable", lambda plan, c: True)  # another node has its resources
    found = topology._failure(1, exceptions.RayActorError(error_msg="gone"))
    assert (found.kind, found.restartable) == ("subcollector-died", True) and found.message.endswith(
        "its node left the cluster (another can hold it)")
    monkeypatch.setattr(ray_collector, "_placeable", lambda plan, c: False)
    found = topology._failure(1, exceptions.RayActorError(error_msg="gone"))
    assert (found.kind, found.subcollector, found.restartable) == ("node-lost", 1, False)
    assert found.message.startswith("node host-b (node bbbbbbbb) was lost: it held subcollector 0's actor, env workers "
                                    "[0, 1]; subcollector 1's actor, env workers [2, 3] (global indices)")


def test_an_actor_blames_the_env_worker_its_rollout_waits_on():
    from topo.runtime.heartbeat import waiting_on as hung

    now = 100.0
    owed = (90.0, 80.0)  # asked at 90, last delivered at 80
    assert hung([owed, (95.0, 95.1), (95.0, 95.1)], [7, 7], 5, now) is None  # stepped 4.9 s ago: not yet
    assert hung([owed, (89.0, 89.1), (89.0, 89.1)], [7, 7], 5, now) == {}  # no worker behind: the actor itself hangs
    assert hung([owed, (89.0, 89.1), (88.0, 88.1)], [7, 6], 5, now) == {1: 10.0}  # stopped before its step, asked 10 s ago
    assert hung([owed, (93.0, 89.1), (89.0, 89.1)], [7, 7], 5, now) == {0: 7.0}  # in a step for 7 s
    assert hung([owed, (97.0, 89.1), (89.0, 89.1)], [7, 7], 5, now) is None  # in a step for 3 s: stepping
    assert hung([(80.0, 90.0), (89.0, 89.1), (88.0, 88.1)], [7, 6], 5, now) is None  # nothing owed


# -- the inference server as a Ray actor --------------------------------------------------------------------

SERVED_ON_RAY = {"version": 1, "env": {"backend": "toy"}, "topology": {"subcollectors": 2, "workers_per_subcollector": 2},
                 "policy": {"factory": "topo.policies.tinyvla:make", "placement": "server"},
                 "placement": {"engine": "ray", "resources": {"cpus": 3}, "server": {"gpus": 1, "custom": {"learner": 1}},
                               "nodes": [{"name": "sim", "count": 2, "cpus": 3},
                                         {"name": "learner", "cpus": 4, "gpus": 1, "custom": {"learner": 1}}]}}


def test_the_plan_places_the_inference_server_actor_and_packs_it_with_the_subcollectors(tmp_path):
    path = tmp_path / "served.yaml"
    path.write_text(yaml.safe_dump(SERVED_ON_RAY))
    placement = topo.compile_spec(str(path))["placement"]
    assert placement["server"] == {
        "resources": {"cpus": 1, "gpus": 1, "memory_gb": None, "custom": {"learner": 1}},
        "remote_config": {"num_cpus": 1, "num_gpus": 1, "resources": {"learner": 1}}, "node": "learner"}
    assert [sub["node"] for sub in placement["subcollectors"]] == ["sim#0", "sim#1"]
    from topo.compiler.render import coverage_text

    assert "  inference server: ray actor (1 cpus, 1 gpus, learner 1) -> learner" in coverage_text(
        topo.compile_spec(str(path))).splitlines()
    local = {**SERVED_ON_RAY, "placement": {"engine": "ray", "resources": {"cpus": 3}}}
    local["policy"] = {"factory": "topo.policies.tinyvla:make"}
    path.write_text(yaml.safe_dump(local))
    assert topo.compile_spec(str(path))["placement"]["server"] is None  # copies in the subcollectors: no server actor


def test_the_served_policy_records_itself_on_the_trainers_queue_under_ray(monkeypatch):
    from topo.launch import policy

    class Notes(list):
        put = list.append

    monkeypatch.setattr(policy, "here", lambda: {"node_id": "f" * 32, "hostname": "host-f"})
    notes = Notes()
    served = policy.in_server("topo.policies.tinyvla:make", {"action_dim": 4, "image_size": 16, "state_dim": 8}, notes)
    (note,) = notes
    assert (note["name"], note["role"], note["pid"], note["actor"]["node_id"]) == ("server", "server", os.getpid(), "f" * 32)
    assert note["in_keys"] == policy._keys(served.in_keys) and note["out_keys"] == policy._keys(served.out_keys)
    notes.clear()
    with pytest.raises(TypeError):
        policy.in_server("topo.launch.ray.placement:describe", {"rows": []}, notes)  # not a TensorDict policy
    assert [n["name"] for n in notes] == ["policy-failed"] and "TensorDictModuleBase" in notes[0]["traceback"]


def test_a_server_actor_that_stops_answering_alive_is_the_runs_server_died_failure_once():
    import threading

    from topo.launch.ray import server as ray_server

    class Server:
        is_alive = True

    found, told = [], threading.Event()
    watch = ray_server.Watch(Server, lambda f: (found.append(f), told.set()), "pid 7 on host-b (node bbbbbbbbbbbb)")
    watch.start()
    Server.is_alive = False
    assert told.wait(3 * ray_server.WATCH_EVERY_S)
    watch.stop()
    (failure,) = found
    assert (failure.kind, failure.subcollector, failure.restartable) == ("server-died", None, False)
    assert "its Ray actor (pid 7 on host-b (node bbbbbbbbbbbb)) no longer answers" in failure.message


def test_the_server_actor_is_checked_and_reported_as_a_subcollectors_actor_is():
    from topo.launch.report import _acting

    (row,) = ray_placement.compare(plan([{"node_b": 0.1}]), [actor("b", {"node_b": 0.1, "CPU": 1})], NODES)
    row = {**row, "subcollector": None}
    assert row["problems"] == []
    assert ray_placement.describe([row]) == [
        "    server: planned node_b 0.1 -> node bbbbbbbb on host-b, pid 1, gpus none [ok]"]
    policy = {"placement": "server", "trainer_policy": True, "updates": 2, "server": row}
    assert _acting(policy, [[2], [2]]).startswith("on one inference server (a Ray actor, pid 1 on host-b, node bbbbbbbb)")
    from topo.launch.ray import server as ray_server

    with pytest.raises(LaunchError, match="the inference server is not where the plan put it: its actor on host-b "
                                          r"\(node bbbbbbbb\) its node has no resource 'node_b'"):
        ray_server.verify({**row, "problems": ["its node has no resource 'node_b'"]})


def test_a_restarted_actor_leaves_its_records_pulled_and_gets_the_eval_round_in_progress(tmp_path, monkeypatch):
    """Before its actor ends, a restarted subcollector's node records are pulled through it; eval rounds are written
    on each actor's node, and an eval actor restarted (maybe on another node) is given the round in progress, which
    its env workers read at their next reset, rather than waiting for the next round."""
    ray = pytest.importorskip("ray")
    from types import SimpleNamespace

    from tests.ray.test_ray_launch import toy_ray_spec
    from topo.launch.ray import engine as ray_collector
    from topo.launch.supervision.port import Restarting

    class Actor:
        def __init__(self, name):
            self.name, self.calls = name, []
            self.topo_node = SimpleNamespace(remote=lambda: "node-ref")
            self.topo_eval_round = SimpleNamespace(remote=lambda n: self.calls.append(("round", n)))

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(toy_ray_spec("127.0.0.1:1")))
    compiled = topo.compile_spec(str(path))
    old, new = [Actor("sub0"), Actor("sub1")], Actor("sub1, restarted")
    replaced = []
    collector = SimpleNamespace(remote_collectors=old, replace=lambda c, factory, restart, policy: replaced.append(c) or new)
    topology = ray_collector.RayTopology(collector, compiled)
    topology.recovery = SimpleNamespace(
        begin=lambda c: Restarting(1, compiled["subcollectors"][c]["workers"], None, contextlib.nullcontext()),
        instantiated=lambda c: None)
    topology.puller = SimpleNamespace(replace=lambda was, now, node: replaced.append((was.name, now.name, node)),
                                      pull=lambda timeout: replaced.append("pulled"))
    monkeypatch.setattr(ray_collector, "_end", lambda actor: replaced.append(f"ended {actor.name}"))
    monkeypatch.setattr(topology, "_wait", lambda c, ref: {"node_id": "c" * 40})
    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: refs)

    ray_collector.RayEngine().set_eval_round(topology, 3)
    assert [a.calls for a in old] == [[("round", 3)], [("round", 3)]]
    topology._restart(1)
    # the old actor's node's records pulled through it before it ends (the new one may land on another node)
    assert replaced == ["pulled", "ended sub1", 1, ("sub1", "sub1, restarted", "c" * 40)] and new.calls == [("round", 3)]


def test_async_on_ray_groups_subcollectors_by_node_and_keeps_their_rows():
    """Async mode on Ray: subcollectors asking for the same custom resources share a node's actor (one asking for none
    gets its own); a node's plan keeps its rows, indices and the whole plan's worker count (restart seeds)."""
    from topo.compiler import plan as plans
    from topo.launch.ray.async_nodes import global_rows, node_groups, node_plan, remote_config
    from topo.launch.supervision.lives import restart_rows

    placed = [{"resources": {"custom": custom}, "remote_config": {"num_cpus": 1, "num_gpus": 0,
                                                                  **({"resources": custom} if custom else {})}}
              for custom in ({"node_a": 1}, {"node_b": 1}, {"node_a": 1}, {})]
    subs = [{"index": c, "num_workers": 2, "workers": [{"index": w, "seed": 10 * c + w, "kwargs": {"seed": 10 * c + w}}
                                                       for w in range(2)]} for c in range(4)]
    plan = {"subcollectors": subs, "placement": {"engine": "ray", "subcollectors": placed,
                                                 "server": {"remote_config": {"num_cpus": 1, "num_gpus": 1}}},
            "collector": {"total_frames": 100}, "coverage": {"workers": 8}, "eval": None}
    assert node_groups(plan) == [[0, 2], [1], [3]]
    assert remote_config(plan, [0, 2]) == {"num_cpus": 2, "num_gpus": 1, "resources": {"node_a": 1}}
    node = node_plan(plan, [0, 2])
    assert [s["index"] for s in node["subcollectors"]] == [0, 2] and node["placement"] == {"engine": "local"}
    assert node["collector"]["total_frames"] == -1
    assert plans.subcollector(node, 2)["index"] == 2
    assert global_rows(plan, [0, 2]) == [0, 1, 4, 5]
    assert [r["seed"] for r in restart_rows(node, 2, 1)] == [28, 29]  # + 1 x the whole plan's 8 workers
