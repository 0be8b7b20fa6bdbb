"""``topo launch`` with ``placement.engine: ray`` on paper (address, runtime_env, remote pids) and at an address where
no cluster listens. Its launches on a real local Ray head (2 actors x 2 toy workers) share the head of
tests/ray/test_ray_auth.py, token auth on: :func:`assert_clean_remote_launch` is what each must show."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

import topo
from topo.runtime import gl
from topo.errors import LaunchError
from topo.launch.ray import engine as ray_collector
from topo.launch.supervision.state import RunState
from topo.runtime.rundir import HOST, RUN_DIR_VAR, SLOTS_VAR, RunDir

from tests import preimported
from tests.ray.ray_head_helpers import ENV, RAY, free_port

HANG_GUARD_S = 300
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None or not RAY.exists(),
                               reason="ray is not installed (pip install 'topo[ray]')")


def toy_ray_spec(address: str, sync: bool = True) -> dict:
    return {
        "version": 1,
        "name": "toy-ray-2x2",
        "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": 2, "workers_per_subcollector": 2,
                     "start_method": {"workers": "spawn"}},  # workers are then children of the actors
        "assignment": {"tasks": [0, 1], "instructions": {0: "push left", 1: "push right"},
                       "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 100}},
        "placement": {"engine": "ray", "address": address, "resources": {"cpus": 1}},
        "collector": {"sync": sync, "frames_per_batch": 4},
        "launch": {"startup_timeout": 180, "shutdown_timeout": 60},
    }


def launch(tmp_path: Path, name: str, spec: dict, *args: str,
           env: dict = ENV) -> tuple[subprocess.CompletedProcess, Path]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = preimported.run([sys.executable, "-m", "topo.launch", path.name, "--report", name, *args],  # relative
                             cwd=tmp_path, capture_output=True, text=True, env=env, timeout=HANG_GUARD_S)
    return result, path


@needs_ray
def test_unreachable_address_is_a_launch_error_naming_it(tmp_path):
    port = free_port()  # nothing listens on it
    result, _ = launch(tmp_path, "down", toy_ray_spec(f"127.0.0.1:{port}"))
    assert result.returncode == 1
    assert f"no Ray cluster at 127.0.0.1:{port}" in result.stderr and "ray start --head" in result.stderr
    assert not (tmp_path / "down").exists()  # refused before anything started


def test_missing_ray_is_a_launch_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(LaunchError, match=r"pip install 'topo\[ray\]'"):
        ray_collector.check_reachable({"address": "auto"})


@needs_ray
def test_the_top_process_checks_without_importing_ray_or_torch():
    code = ("import sys, topo.launch.ray.engine as r; r.check_reachable({'address': 'auto'}); "
            "sys.exit(bool({'ray', 'torch', 'torchrl'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_runtime_env_adds_topo_and_the_absolute_run_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RUN_DIR_VAR, "report/topo-run-x")  # `--report report`: relative to this process only
    monkeypatch.setenv(SLOTS_VAR, "4")
    plan = {"placement": {"runtime_env": {"env_vars": {"MUJOCO_GL": "egl"}, "py_modules": ["/mine"]}}}
    env = ray_collector.runtime_env(plan)
    assert env["env_vars"] == {"MUJOCO_GL": "disable", gl.HELD_VAR: "egl",  # held in the actor, egl for its workers
                               RUN_DIR_VAR: str(tmp_path / "report/topo-run-x"), SLOTS_VAR: "4"}
    assert env["py_modules"] == ["/mine", str(Path(topo.__file__).parent)]
    assert plan["placement"]["runtime_env"]["py_modules"] == ["/mine"]  # the plan is left as it was
    monkeypatch.setenv(gl.HELD_VAR, "osmesa")  # this collector process held the user's osmesa
    assert ray_collector.runtime_env({"placement": {"runtime_env": {}}})["env_vars"][gl.HELD_VAR] == "osmesa"


def test_pids_from_another_node_are_never_watched_here(tmp_path):
    """A shared run directory brings remote pids: meaningless on this machine, never judged dead nor killed."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(toy_ray_spec("auto")))
    state = RunState(topo.compile_spec(str(spec)), RunDir(str(tmp_path / "run")), time.time(), trainer_pid=-1)
    dead = subprocess.Popen(["true"])
    dead.wait()
    here = os.getpid()  # alive on this machine, but the remote markers below are not about it
    markers = tmp_path / "run" / "markers"
    markers.mkdir(parents=True)
    for name, pid, host, fields in [
        ("subcollector", here, "other-node", {"index": 0, "start_method": "spawn"}),
        ("started", here + 1, "other-node", {"worker": {"subcollector": 0, "index": 0}}),
        ("subcollector", dead.pid, HOST, {"index": 1, "start_method": "spawn"}),
    ]:
        record = {"name": name, "pid": pid, "ppid": 1, "host": host, "time": time.time(), **fields}
        (markers / f"{name}.{pid}.json").write_text(json.dumps(record))
    state.update()
    assert [state.subcollectors[c].pid for c in (0, 1)] == [here, dead.pid] and state.workers[0, 0].pid == here + 1
    assert [pid for pid, _ in state.pids_to_watch()] == [dead.pid]  # the only one watched for its death here
    assert state.known_pids() == {dead.pid}  # nor counted, nor ended, by pid


def assert_clean_remote_launch(s: dict, plan: dict, run_dir: Path) -> None:
    """No env on the driver, one per worker process under an actor, seeds as planned, every env closed."""
    p = s["processes"]
    assert s["ok"] and s["exit_code"] == 0
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert s["env_closes"] == {"constructed": 4, "closed": 4}
    assert s["seeds"] == {"checked": 4, "mismatches": []}
    assert s["inherited_gl"] == {"workers": 0, "libraries": []}  # the actors held GL: no display before a builder
    actors = p["subcollector_pids"]
    assert None not in actors and len(set(actors)) == 2 and p["trainer_pid"] not in actors
    records = [json.loads(f.read_text()) for f in (run_dir / "markers").glob("*.json")]
    assert {r["ppid"] for r in records if r["name"] == "subcollector"} & {p["trainer_pid"]} == set()  # Ray's
    assert {r["ppid"] for r in records if r["name"] == "constructed"} == set(actors)  # spawned by the actors
    assert sorted(r["seed"] for r in records if r["name"] == "constructed") == sorted(
        row["seed"] for sub in plan["subcollectors"] for row in sub["workers"])
    assert p["subcollector_exit_codes"] == [None, None]  # actors have none: Ray ends them after their envs close
    assert p["left_behind"] == [] and p["alive_after"] == []
    assert s["timings_s"]["shutdown"] < s["launch"]["shutdown_budget_s"]


def alive(pids: set[int], before: float) -> list[int]:
    """Those of ``pids`` still running that existed before ``before`` (a reused pid is someone else's)."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() <= before and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(out)
