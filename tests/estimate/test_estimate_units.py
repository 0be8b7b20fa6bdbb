"""``topo plan --estimate`` and the launch's memory check without starting a process: the model's figures from a
fake LIBERO-like probe, the refusal with its arithmetic, Ray nodes' declared memory, the cache's key, and
``topo launch`` refused before anything starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from topo.cli import main
from topo.estimate import cache, command, model
from topo.estimate.model import HOST, Budget, Layout
from tests.compiler.compiler_helpers import compile_dict, libero, spec_text, toy

GB = 2 ** 30
#: one LIBERO-like worker alone: 6 s to start and import, 1 s to build, 0.5 s to reset; 1.5 GB at its peak
LIBERO_PROBE = {
    "start_s": 0.1, "start_cpu_s": 0.1, "imports_s": 5.9, "imports_cpu_s": 5.9, "construct_s": 1.0,
    "construct_cpu_s": 1.0, "reset_s": 0.5, "reset_cpu_s": 0.5, "torchrl_rss_bytes": 0.5 * GB,
    "rss_after_reset_bytes": 1.4 * GB, "peak_rss_bytes": 1.5 * GB, "pid": 1, "measured_at": 0,
    "steps": {"count": 30, "p50_s": 0.15, "p95_s": 0.20, "mean_s": 0.16, "cpu_mean_s": 0.25, "reset_s": 0.32,
              "reset_cpu_s": 0.32, "episode_steps": None},
}
HOST_20 = {HOST: Budget(20.0, 2, "MemAvailable")}


@pytest.fixture(autouse=True)
def _environ():
    """``topo launch`` run in this process holds GL in its environment (``TOPO_MUJOCO_GL``), as it would in its own
    process: the pytest process's environment is put back, or later tests' children inherit it."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)  # a 24 GiB host with 20 GB available, 2 cores


def libero_plan(subcollectors: int, workers: int, **extra) -> dict:
    data = libero(subcollectors, workers, tasks="0-1", init_states={"mode": "cycle"})
    data["env"]["kwargs"]["max_episode_steps"] = 64
    data["collector"] = {"frames_per_batch": 16}
    data.update(extra)
    return compile_dict(data)


def test_libero_1x16_is_refused_with_the_arithmetic_and_what_fits():
    fp, pace = model.probed(LIBERO_PROBE, horizon=64)
    layout = Layout.of(libero_plan(1, 16))
    got = model.check(layout, fp, HOST_20)
    # 16 workers, and 3 bare processes: the subcollector, the run's forkserver, the trainer
    assert got["nodes"][HOST]["memory"].gb == pytest.approx(16 * 1.5 + 3 * 0.5)
    assert got["refusals"] == ["1 x 16 needs 16 workers x 1.50 GB + 3 processes x 0.50 GB = 25.5 GB; 20.0 GB "
                               "available on this host (MemAvailable), 18.0 GB usable (90%); this host fits 1 x 11"]
    # (0.9 x 20 - 1.5) // 1.5 = 11
    assert got["warnings"] == ["16 busy workers on 2 cores of this host (8.0 per core): steps slow down about 8.0x "
                               "against one worker alone; the CPU caps frames/s"]
    ready = model.ready(layout, pace, HOST_20)
    # the bound (forkserver-preload): 1 importing process (the run's forkserver) x 6 s + 16 x (1 + 0.5) s = 30 CPU-s
    # on 2 cores; chain 6 + 1.5; expected: the forkserver's imports (6 s), then the workers' 24 CPU-s on 2 cores
    assert (ready["s"], ready["bound_s"], ready["chain_s"], ready["work_s"], ready["mode"]) == (
        18.0, 15.0, 7.5, 30.0, "forkserver-preload")
    spawning = libero(1, 16, tasks="0-1", init_states={"mode": "cycle"})
    spawning["env"]["kwargs"]["max_episode_steps"] = 64
    spawning["topology"]["start_method"] = {"subcollectors": "spawn"}
    spawned = model.ready(Layout.of(compile_dict(spawning)), pace, HOST_20)
    assert spawned["s"] == 24.0  # the subcollector's imports, then its own forkserver's (12 s), then the workers


def test_eval_workers_count_beside_training_and_leave_less_for_it():
    fp, _ = model.probed(LIBERO_PROBE, horizon=64)
    plan = libero_plan(1, 4, eval={"tasks": "2-3", "init_states": "0-3", "workers": {"subcollectors": 2,
                                                                                  "workers_per_subcollector": 4}})
    got = model.check(Layout.of(plan), fp, HOST_20)
    # 4 + 8 workers; processes: the subcollector and the run's forkserver, the trainer, the eval process, 2 eval
    # subcollectors and the eval run's forkserver
    assert got["refusals"] == ["1 x 4 with 8 eval worker(s) needs 12 workers x 1.50 GB + 7 processes x 0.50 GB = "
                               "21.5 GB; 20.0 GB available on this host (MemAvailable), 18.0 GB usable (90%); this "
                               "host fits 1 x 1"]  # (18 - 4) // 1.5 = 9 workers, 8 of them eval's
    alone = model.check(Layout.of(libero_plan(1, 4)), fp, HOST_20)
    assert alone["refusals"] == [] and alone["nodes"][HOST]["memory"].gb == pytest.approx(4 * 1.5 + 3 * 0.5)


def test_libero_1x8_is_accepted_and_its_frames_per_s_are_the_cpus():
    fp, pace = model.probed(LIBERO_PROBE, horizon=64)
    layout = Layout.of(libero_plan(1, 8))
    got = model.check(layout, fp, HOST_20)
    assert got["refusals"] == [] and got["nodes"][HOST]["memory"].gb == pytest.approx(8 * 1.5 + 3 * 0.5)
    fps = model.frames(layout, pace, HOST_20)
    slowest = 0.15 + 0.05 * ((8 / 9 - 0.5) / 0.45)  # the slowest of 8 steps, between p50 and p95
    assert fps["sync"] == pytest.approx(2 / (0.25 + 0.32 / 64))  # 8 / (slowest + 0.005) = 40.4 > the CPU's 7.8
    assert fps["async"] == pytest.approx(2 / 0.255) and fps["bound_by"] == "cpu"
    assert 8 / (slowest + 0.32 / 64) > fps["cpu_cap"]
    assert fps["iteration_s"] == pytest.approx(16 / (2 / 0.255))  # frames_per_batch 16


def test_steps_bound_frames_per_s_when_the_cpu_is_ample():
    fp, pace = model.probed(LIBERO_PROBE, horizon=64)
    layout = Layout.of(libero_plan(2, 4))
    many = {HOST: Budget(64.0, 64, "MemAvailable")}
    fps = model.frames(layout, pace, many)
    slowest = 0.15 + 0.05 * ((4 / 5 - 0.5) / 0.45)
    assert fps["sync"] == pytest.approx(8 / (slowest + 0.005)) and fps["bound_by"] == "steps"
    assert fps["async"] == pytest.approx(8 / (0.16 + 0.005))
    # the data plane: 2 ms a worker, serial in each subcollector's round (4 workers), sync mode only
    _, piped = model.probed({**LIBERO_PROBE, "plane": {"workers": 2, "wall_s": 0.002}}, horizon=64)
    fps = model.frames(layout, piped, many)
    assert fps["sync"] == pytest.approx(8 / (slowest + 0.005 + 4 * 0.002))
    assert fps["async"] == pytest.approx(8 / (0.16 + 0.005))


def test_a_policy_adds_its_copies_and_its_forward():
    result = {**LIBERO_PROBE, "policy": {"batch": 8, "device": "cpu", "forward_s": 0.04, "forward_cpu_s": 0.08,
                                         "param_bytes": 0.25 * GB}}
    fp, pace = model.probed(result, horizon=64)
    plan = libero_plan(1, 8, policy={"factory": "topo.policies.tinyvla:make", "placement": "server"})
    need = model.memory(Layout.of(plan), fp, HOST)
    # the subcollector, its forkserver, the server, the trainer; copies: the server's and the trainer's
    assert (need.processes, need.policies, need.gb) == (4, 2, pytest.approx(8 * 1.5 + 4 * 0.5 + 2 * 0.25))
    assert pace.cpu_per_frame() == pytest.approx(0.25 + 0.32 / 64 + 0.08 / 8)


def test_a_named_gpu_gets_documented_figures_said_unmeasured():
    fp, _ = model.probed(LIBERO_PROBE, horizon=64)
    data = libero(1, 4, tasks="0-1", init_states={"mode": "cycle"}, render_gpus=[0])
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "device": "cuda"}
    notes = model.gpu_notes(Layout.of(compile_dict(data)), fp, renders=True)
    assert notes[0].startswith("policy on cuda:") and "not measured here" in notes[0]
    assert notes[1].startswith("render GPU 0: 4 EGL contexts") and "not measured here" in notes[1]


def test_under_ray_each_declared_nodes_memory_is_used():
    fp, _ = model.probed(LIBERO_PROBE, horizon=64)
    plan = libero_plan(2, 8, placement={
        "engine": "ray", "resources": {"cpus": 9, "memory_gb": 8},
        "nodes": [{"name": "small", "count": 2, "cpus": 16, "memory_gb": 10}]})
    budgets = {**command.node_budgets(plan, {"placement": {"nodes": [{"name": "small", "count": 2, "cpus": 16,
                                                                        "memory_gb": 10}]}}),
               HOST: Budget(1000.0, 2, "MemAvailable")}
    assert budgets["small#1"] == Budget(10, 16, "declared memory_gb")
    got = model.check(Layout.of(plan), fp, budgets)
    assert got["nodes"][HOST]["memory"].gb == pytest.approx(0.5)  # the trainer alone here
    assert got["refusals"] == [f"1 x 8 needs 8 workers x 1.50 GB + 2 processes x 0.50 GB = 13.0 GB; 10.0 GB available "
                               f"on {n} (declared memory_gb), 9.0 GB usable (90%); {n} fits 1 x 5"
                               for n in ("small#0", "small#1")]


def test_the_target_is_the_fewest_workers_or_why_none():
    fp, pace = model.probed(LIBERO_PROBE, horizon=64)
    layout = Layout.of(libero_plan(1, 16))
    many = {HOST: Budget(64.0, 64, "MemAvailable")}
    assert model.target(100, layout, fp, pace, many)["shape"] == "1 x 21"  # 21 / (0.20 + 0.005): p95 from 19 workers
    assert model.target(7, layout, fp, pace, HOST_20)["shape"] == "1 x 2"
    assert model.target(50, layout, fp, pace, HOST_20)["why"] == (
        "CPU-bound: at most 8 frames/s on 2 cores (255.0 CPU-ms per frame), reached at 1 x 2")
    # (0.9 x 64 - 3 x 0.5) // 1.5 = 37 workers fit; 37 / (0.20 + 0.005) = 180 frames/s
    assert model.target(1000, layout, fp, pace, many)["why"] == "memory: the largest that fits, 1 x 37, gives 180 frames/s"


def test_the_cache_key_drops_what_is_per_worker():
    plan = libero_plan(1, 4)
    backend = command._backend(plan)
    keys = {cache.key(command.probe_request({**plan, "subcollectors": [{**plan["subcollectors"][0], "workers": [row]}]},
                                            backend)[0]) for row in plan["subcollectors"][0]["workers"]}
    assert len(keys) == 1  # the rows differ in task, seed, init state, group: one probe for all
    other = libero_plan(1, 4)
    other["subcollectors"][0]["workers"][0]["kwargs"]["env"]["camera_height"] = 256
    assert cache.key(command.probe_request(other, backend)[0]) not in keys


def test_the_probed_worker_is_forked_as_the_plans_workers_are():
    default = compile_dict(toy(1, 2))
    assert command.forked_from(default) == ["torch", "torchrl.envs", "topo.worker", "topo.envs.toy"]
    spawned = compile_dict({**toy(1, 2), "topology": {"subcollectors": 1, "workers_per_subcollector": 2,
                                                      "start_method": {"workers": "spawn"}}})
    assert command.forked_from(spawned) is None


def test_the_estimate_imports_no_torch():
    code = ("import sys, topo.estimate.command, topo.estimate.model, topo.estimate.cache, topo.doctor.host; "
            "print(sorted(m for m in ('torch', 'torchrl', 'tensordict') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


@pytest.fixture
def fake_probe(monkeypatch, tmp_path):
    """A cache in tmp_path; the probe replaced by LIBERO_PROBE (its calls counted); 20 GB available here."""
    monkeypatch.setenv(cache.CACHE_VAR, str(tmp_path / "estimates"))
    calls = []
    monkeypatch.setattr("topo.estimate.probe.run", lambda request: calls.append(request) or dict(LIBERO_PROBE))
    monkeypatch.setattr("topo.estimate.host.available_gb", lambda: 20.0)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    return calls


class Started(Exception):
    """A run was made: what the launch's memory check must come before."""


def started(*args, **kwargs):
    raise Started


def write(tmp_path, data) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(spec_text(data))
    return str(path)


def test_plan_estimate_refuses_with_exit_2_and_force_passes(tmp_path, fake_probe):
    data = libero(1, 16, tasks="0-1", init_states={"mode": "cycle"})
    spec = write(tmp_path, data)
    refused = CliRunner().invoke(main, ["plan", spec, "--estimate"])
    assert refused.exit_code == 2, refused.output
    assert "error memory-exceeds-node at topology.workers_per_subcollector" in refused.output
    assert "16 workers x 1.50 GB + 3 processes x 0.50 GB = 25.5 GB; 20.0 GB available" in refused.output
    assert "this host fits 1 x 11" in refused.output and "DOES NOT FIT" in refused.output
    forced = CliRunner().invoke(main, ["plan", spec, "--estimate", "--force", "--format", "json"])
    assert forced.exit_code == 0, forced.output
    out = json.loads(forced.stdout)
    assert out["probe"]["source"] == "cache" and out["nodes"][HOST]["fits"] is False
    assert len(fake_probe) == 1  # the second call read the cache
    fresh = CliRunner().invoke(main, ["plan", spec, "--estimate", "--force", "--reprobe"])
    assert fresh.exit_code == 0 and len(fake_probe) == 2 and "measured now" in fresh.output


def test_launch_is_refused_before_anything_starts_from_the_declared_figure(tmp_path, monkeypatch, fake_probe):
    import topo.launch.run

    monkeypatch.setattr(topo.launch.run, "Run", started)
    spec = write(tmp_path, libero(1, 16, tasks="0-1", init_states={"mode": "cycle"}))
    refused = CliRunner().invoke(main, ["launch", spec, "--report", str(tmp_path / "report")])
    assert refused.exit_code == 2, refused.output
    # the backend's declared 2.0 GB per worker, 3 processes x 0.4 GB: no probe was cached for this plan
    assert "16 workers x 2.00 GB + 3 processes x 0.40 GB = 33.2 GB; 20.0 GB available on this host" in refused.output
    assert "this host fits 1 x 8" in refused.output and "declared memory per worker" in refused.output
    assert not (tmp_path / "report").exists() and fake_probe == []
    forced = CliRunner().invoke(main, ["launch", spec, "--force"])
    assert isinstance(forced.exception, Started) and "--force: launching anyway" in forced.output


def test_launch_reads_a_cached_probe_of_the_plan(tmp_path, monkeypatch, fake_probe):
    import topo.launch.run

    monkeypatch.setattr(topo.launch.run, "Run", started)
    spec = write(tmp_path, toy(1, 4))
    assert CliRunner().invoke(main, ["plan", spec, "--estimate"]).exit_code == 0
    small = CliRunner().invoke(main, ["launch", spec])
    assert isinstance(small.exception, Started)
    assert "4 workers x 1.50 GB + 3 processes x 0.50 GB = 7.5 GB of 18.0 GB usable (90% of 20.0 GB available), from a cached probe" in small.output


def test_an_eval_too_big_for_this_host_is_refused_before_anything_starts(tmp_path, monkeypatch, fake_probe):
    import topo.launch.evaluate

    monkeypatch.setattr(topo.launch.evaluate, "Evaluation", started)
    data = libero(1, 2, tasks="0-1", init_states={"mode": "cycle"})
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 7, "image_size": 64,
                                                                         "state_dim": 9}}
    data["eval"] = {"tasks": "2-9", "init_states": "0-1", "workers": {"subcollectors": 2, "workers_per_subcollector": 8}}
    refused = CliRunner().invoke(main, ["eval", write(tmp_path, data), "--report", str(tmp_path / "report")])
    assert refused.exit_code == 2, refused.output
    # its eval rows are the run: 2 eval subcollectors, the run's forkserver and this process
    assert "2 x 8 needs 16 workers x 2.00 GB + 4 processes x 0.40 GB = 33.6 GB" in refused.output
    assert "20.0 GB available on this host" in refused.output and not (tmp_path / "report").exists()
