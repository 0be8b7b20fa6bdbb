"""A third-party backend installed from a package (tests/plugin: torchrl's PendulumEnv, one gravity per task),
found through the ``topo.backends`` entry points: validated, planned, doctored and launched with 0
constructions outside its env workers, and nothing in topo changed for it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.launch.launch_helpers import LAUNCH_LIMITS, assert_clean_launch, launch, subprocess_env, write

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"
SPEC = {
    "version": 1,
    "name": "pendulum-2x2",
    "env": {"backend": "pendulum"},
    "topology": {"subcollectors": 2, "workers_per_subcollector": 2},
    "assignment": {"tasks": "0-1", "seeds": {"base": 5}},
    "collector": {"frames_per_batch": 16},
    "launch": dict(LAUNCH_LIMITS),
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The plug-in pip-installed (no dependencies, no index) into a folder of its own; returns that folder."""
    source = tmp_path_factory.mktemp("source") / "plugin"
    shutil.copytree(PLUGIN, source)
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    return target


def topo(*args, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "topo", *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_plugin_is_listed_validated_planned_and_doctored(installed, tmp_path):
    """Long for a test without a launch: each `topo` command is a fresh process that finds the plug-in through its
    entry points, and `topo doctor` probes this host in child processes."""
    env = subprocess_env(installed)
    spec = write(tmp_path / "pendulum.yaml", SPEC)
    assert "pendulum                 plug-in topo-pendulum 0.1.0" in topo("--help", env=env).stdout
    assert "pendulum" not in topo("--help", env=subprocess_env()).stdout  # not installed there

    assert topo("validate", spec, env=env).returncode == 0
    plan_path = tmp_path / "plan.json"
    assert topo("plan", spec, "-o", plan_path, env=env).returncode == 0
    rows = [w for sub in json.loads(plan_path.read_text())["subcollectors"] for w in sub["workers"]]
    assert [(w["task_id"], w["instruction"], w["kwargs"]["env"], w["kwargs"]["builder"]) for w in rows] == [
        (0, "swing up on the earth", {"g": 9.81}, "topo_pendulum.build:build"),
        (1, "swing up on the moon", {"g": 1.62}, "topo_pendulum.build:build"),
    ] * 2

    doctor = topo("doctor", spec, "--format", "json", env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["backend"]["detail"] == "pendulum: plug-in topo-pendulum 0.1.0"
    assert "topo-pendulum 0.1.0" in checks["imports"]["detail"]
    assert "4 workers x 0.4 GB" in checks["memory"]["detail"]

    bad = write(tmp_path / "bad.yaml", {**SPEC, "env": {"backend": "pendulum", "kwargs": {"g": 3.0, "mass": 2}}})
    result = topo("validate", bad, env=env)
    assert result.returncode == 2
    assert "error kwargs-reserved at env.kwargs.g" in result.stderr and "hint: the task sets gravity" in result.stderr
    assert "error pendulum-unknown-kwarg at env.kwargs.mass" in result.stderr


@pytest.mark.slow
def test_a_plugin_launches_with_every_env_in_its_worker(installed, tmp_path):
    """Long: `topo plan` in a process of its own, then a real 2 x 2 launch of the installed plug-in's plan (a
    trainer, 2 subcollectors, their workers) and its teardown."""
    env = subprocess_env(installed)
    spec = write(tmp_path / "pendulum.yaml", SPEC)
    assert topo("plan", spec, "-o", tmp_path / "plan.json", env=env).returncode == 0
    report = tmp_path / "report"
    result = launch(tmp_path / "plan.json", "--report", report, env=env)
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    s = assert_clean_launch(report, json.loads((tmp_path / "plan.json").read_text()), t_end)
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert [seen["status"] for seen in s["first_batch"]] == ["nothing observable"] * 2  # PendulumEnv shows no rows
