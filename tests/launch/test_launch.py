"""Real nested launches (torchrl, CPU, spawn): 0 constructions outside env workers, the planned
instruction / group / seed in every worker, every env closed, no process left, checked by pid."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import topo
from topo.compiler.plan import dumps

from tests import preimported
from tests.launch.launch_helpers import (HANG_GUARD_S, LAUNCH_LIMITS, alive, assert_clean_launch,
                                        assert_first_batch_matches, command, launch, started_pids, subprocess_env,
                                        summary, toy_spec, user_spec, write)

GYM_2X3 = {
    "version": 1,
    "name": "halfcheetah-2x3",
    "env": {"backend": "gym", "kwargs": {"env_name": "HalfCheetah-v5"}},
    "topology": {"subcollectors": 2, "workers_per_subcollector": 3},
    "assignment": {"seeds": {"base": 7}},
    "collector": {"sync": False, "frames_per_batch": 12},
    "launch": dict(LAUNCH_LIMITS),
}


@pytest.mark.slow
def test_toy_2x3_from_spec_with_a_policy_from_the_command_line(tmp_path):
    """A spec, and a policy given on the command line that acts in every subcollector."""
    spec = write(tmp_path / "toy.yaml", toy_spec(2, 3))
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--batches", "2", "--policy", "topo.policies.tinyvla:make")
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    assert "run ok" in result.stdout and "worker 6" in result.stdout
    assert "policy topo.policies.tinyvla:make in each subcollector, with the factory's weights" in result.stdout
    plan = topo.compile_spec(str(spec))
    s = assert_clean_launch(report, plan, t_end)  # 0 envs outside env workers, with a policy
    assert_first_batch_matches(s, plan)
    assert len({r["instruction"] for sub in plan["subcollectors"] for r in sub["workers"]}) == 3
    assert s["launch"]["batches_collected"] == 2
    assert (s["policy"]["factory"], s["policy"]["trainer_policy"], s["policy"]["updates"]) == (
        "topo.policies.tinyvla:make", False, 0)
    assert [e["policy_versions"] for e in s["first_batch"]] == [None, None]  # no trainer weights: not versioned
    # `topo top` of the run that ended, named as the demo's user names it (relative, from the report's parent)
    top = preimported.run([sys.executable, "-m", "topo", "top", "report", "--once", "--format", "json"],
                          env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path)
    header = json.loads(top.stdout)["header"]
    assert (header["running"], header["ok"], header["batches"]) == (False, True, 2), top.stderr
    ended, launched = (Path(s["run_dir"], name).stat().st_mtime for name in ("summary.json", "launch.json"))
    assert header["elapsed_s"] == round(ended - launched, 1)  # the run's length, not the time since it began


@pytest.mark.slow
def test_a_saved_plan_of_one_forkserver_subcollector_keeps_its_env_in_a_worker(tmp_path):
    """A plan written by `topo plan`, launched with the spec it came from (no policy, --quiet); its one
    subcollector of one worker keeps the env in a worker process, started the plan's way (forkserver)."""
    topology = {"subcollectors": 1, "workers_per_subcollector": 1,
                "start_method": {"subcollectors": "forkserver", "workers": "spawn"}}
    spec = write(tmp_path / "one.yaml", toy_spec(1, 1, topology=topology))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(dumps(topo.compile_spec(str(spec))))
    report = tmp_path / "report"
    result = launch(plan_path, "--spec", spec, "--report", report, "--quiet")
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # --quiet
    plan = json.loads(plan_path.read_text())
    s = assert_clean_launch(report, plan, t_end)  # the env is not in the subcollector (no SerialEnv)
    assert_first_batch_matches(s, plan)
    assert s["processes"]["subcollector_start_methods"] == ["forkserver"]  # the plan's, not torchrl's spawn


@pytest.mark.slow
def test_a_plan_saved_before_the_house_moved_still_launches(tmp_path):
    """tests/launch/plans/before-house.plan.json was written by `topo plan` at commit cd52f5a, before topo's modules
    moved into compiler/, runtime/ and launch/'s folders: what it names (topo.worker, topo.envs.toy:build) still
    imports, and it runs as it is (its spec is not beside it: not checked against it)."""
    saved = Path(__file__).parent / "plans" / "before-house.plan.json"
    report = tmp_path / "report"
    result = preimported.run(command(saved, "--report", report, "--quiet"), env=subprocess_env(), capture_output=True,
                             text=True, timeout=HANG_GUARD_S, cwd=tmp_path)
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    plan = json.loads(saved.read_text())
    assert plan["launch"]["preload"] == ["torch", "torchrl.envs", "topo.worker", "topo.envs.toy"]  # the forkserver's
    s = assert_clean_launch(report, plan, t_end)  # every row built once, in a worker, with its planned seed
    assert s["seeds"]["mismatches"] == [] and s["launch"]["batches_collected"] == 1


@pytest.mark.slow
def test_gym_2x3_async_with_start_slots(tmp_path):
    spec = write(tmp_path / "gym.yaml", GYM_2X3)
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet", "--batches", "2", "--max-concurrent-starts", "2")
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    s = assert_clean_launch(report, topo.compile_spec(str(spec)), t_end)
    assert s["launch"]["batches_collected"] == 2
    assert s["launch"]["max_concurrent_starts"] == 2
    assert 1 <= s["launch"]["peak_concurrent_starts"] <= 2
    assert [e["status"] for e in s["first_batch"]] == ["nothing observable"] * 2  # gym: no instruction, no group id


@pytest.mark.slow
def test_user_factory_from_a_file_outside_the_package_async(tmp_path):
    folder = tmp_path / "userenvs"
    folder.mkdir()
    (folder / "my_envs.py").write_text(
        "def make(*, instruction, group_id_offset, seed, **_):\n"
        "    from torchrl.envs import ToyVLAEnv\n"
        "    return ToyVLAEnv(instruction=instruction, group_id_offset=group_id_offset, seed=seed,\n"
        "                     success_steps=4, state_dim=8, group_repeats=2)\n")
    data = user_spec("my_envs:make", 2, 1)
    data["assignment"].update({"tasks": [0, 1], "instructions": {0: "open the drawer", 1: "close the drawer"}})
    data["collector"] = {"sync": False, "frames_per_batch": 2}
    spec = write(tmp_path / "user.yaml", data)
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet", "--batches", "8", env=subprocess_env(folder))
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    plan = summary(report)["plan"]
    assert plan["env"]["builder"] == "topo.envs.user:build"
    s = assert_clean_launch(report, plan, t_end)
    assert_first_batch_matches(s, plan)  # async batches attributed to their subcollector by content
    assert [e["instructions"] for e in s["first_batch"]] == [["open the drawer"], ["close the drawer"]]


@pytest.mark.slow
def test_constructions_outside_workers_show_in_the_report(tmp_path):
    # metadata_from_workers: false makes each subcollector build a throwaway env to read specs
    spec = write(tmp_path / "meta.yaml", toy_spec(2, 1, launch={**LAUNCH_LIMITS, "metadata_from_workers": False}))
    report = tmp_path / "report"
    result = launch(spec, "--report", report)
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    assert "parent-env-construction" in result.stderr  # the compiler's warning, shown by launch
    s = summary(report)
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 2, "worker": 2}
    assert "subcollector 2" in result.stdout
    assert s["processes"]["alive_after"] == [] and alive(started_pids(report), t_end) == []


def test_stale_plans_are_refused(tmp_path):
    spec = write(tmp_path / "toy.yaml", toy_spec(1, 1))
    plan = topo.compile_spec(str(spec))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(dumps(plan))

    write(spec, toy_spec(1, 2))  # the spec changed after the plan was written
    for args in ([plan_path], [plan_path, "--spec", spec]):
        result = launch(*args)
        assert result.returncode == 2, result.stderr
        assert "plan is stale" in result.stderr and "Traceback" not in result.stderr

    other = tmp_path / "old_format.json"
    other.write_text(json.dumps({**plan, "format": "topo.plan/0"}))
    result = launch(other)
    assert result.returncode == 2 and "re-run `topo plan`" in result.stderr

    newer = tmp_path / "newer_topo.json"
    newer.write_text(json.dumps({**plan, "topo_version": "99.0.0", "spec": {**plan["spec"], "path": None}}))
    result = launch(newer)
    assert result.returncode == 2 and "topo 99.0.0" in result.stderr
