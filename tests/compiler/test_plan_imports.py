"""A plan names code by design: `topo plan` and `topo launch` of a saved plan list every module it imports and
the callables it names there, from the plan alone, before anything runs."""
from __future__ import annotations

import subprocess
import sys

import topo
from topo.compiler.load import parse
from topo.compiler.imports import callables, describe

USER = """
version: 1
env: {backend: "topo.envs.toy:build", kwargs: {success_steps: 4}}
topology: {subcollectors: 1, workers_per_subcollector: 2}
policy: {factory: "topo.policies.tinyvla:make", kwargs: {action_dim: 4}}
"""


def test_every_callable_a_plan_names_is_listed_with_its_role():
    plan = topo.compile_source(parse(USER, "user.yaml"))
    assert callables(plan) == {"topo.envs.user:build": "env builder", "topo.envs.toy:build": "env factory",
                               "topo.policies.tinyvla:make": "policy factory"}
    assert describe(plan) == ("launching this plan imports topo.envs.user (env builder topo.envs.user:build), "
                              "topo.envs.toy (env factory topo.envs.toy:build) and topo.policies.tinyvla "
                              "(policy factory topo.policies.tinyvla:make)")
    edited = dict(plan, subcollectors=[{"workers": [{"kwargs": {"builder": "evil.module:run"}}]}])
    assert "evil.module (env builder evil.module:run)" in describe(edited)


def test_plan_and_launch_of_a_saved_plan_name_the_modules_first(tmp_path):
    spec = tmp_path / "user.yaml"
    spec.write_text(USER)
    done = subprocess.run([sys.executable, "-m", "topo", "plan", str(spec), "-o", str(tmp_path / "plan.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "note: launching this plan imports topo.envs.user" in done.stderr, done.stderr
    # topo launch resolves a saved plan first: the note comes before torch, a policy or an env is imported
    code = ("import sys, topo.compiler.saved as p; p.resolve(sys.argv[1]); "
            "assert 'torch' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "plan.json")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "note: launching this plan imports topo.envs.user" in done.stderr, done.stderr
