"""env.transforms: typed in the spec, carried by the plan (and each worker row, when placed in workers), read back."""
from __future__ import annotations

import json

import pytest

import topo
from topo.compiler.load import parse
from topo.compiler.plan import dumps
from topo.compiler.saved import check_plan, read_plan
from topo.errors import SpecError

from tests.compiler.hostile_inputs import HEAD

STACK = """  transforms:
    - MultiAction: {stack_rewards: false}
    - SuccessReward
    - StepCounter: {max_steps: 64}
"""
PLANNED = [{"name": "MultiAction", "kwargs": {"stack_rewards": False}}, {"name": "SuccessReward", "kwargs": {}},
           {"name": "StepCounter", "kwargs": {"max_steps": 64}}]


def spec_text(at: str | None = None, extra: str = "") -> str:
    env = "env:\n  backend: toy\n" + STACK + (f"  transforms_at: {at}\n" if at else "")
    return HEAD.replace("env: {backend: toy}\n", env) + extra


def compiled(text: str) -> dict:
    return topo.compile_source(parse(text, "toy.yaml"))


def rows(plan: dict, section: dict | None = None):
    for sub in (section or plan)["subcollectors"]:
        yield from sub["workers"]


def test_the_spec_types_the_stack_in_order():
    from topo.compiler.spec import Transform
    from topo.compiler.validate import validate

    spec = validate(parse(spec_text(), "toy.yaml")).spec
    assert spec.transforms == (Transform("MultiAction", {"stack_rewards": False}, 0), Transform("SuccessReward", {}, 1),
                               Transform("StepCounter", {"max_steps": 64}, 2))
    assert spec.transforms_at == "worker"


def test_in_workers_every_row_carries_the_stack_after_its_worker_key():
    plan = compiled(spec_text(extra="eval: {trials: 1}\n"))
    assert plan["env"]["transforms"] == PLANNED and plan["env"]["transforms_at"] == "worker"
    for row in list(rows(plan)) + list(rows(plan, plan["eval"])):
        assert row["kwargs"]["transforms"] == PLANNED
        assert list(row["kwargs"])[-1] == "transforms"


def test_over_the_subcollector_rows_carry_nothing():
    plan = compiled(spec_text("subcollector"))
    assert plan["env"]["transforms_at"] == "subcollector" and plan["env"]["transforms"] == PLANNED
    assert all("transforms" not in row["kwargs"] for row in rows(plan))


def test_without_transforms_the_plan_has_no_key():
    plan = compiled(HEAD)
    assert "transforms" not in plan["env"] and "transforms_at" not in plan["env"]
    empty = compiled(HEAD.replace("{backend: toy}", "{backend: toy, transforms: []}"))
    assert {**empty, "spec": None} == {**plan, "spec": None}


@pytest.mark.parametrize("at", ["worker", "subcollector"])
def test_a_saved_plan_with_a_stack_reads_back(tmp_path, at):
    text = dumps(compiled(spec_text(at)))
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert dumps(read_plan(str(path))) == text


@pytest.mark.parametrize("edit, where", [
    (lambda p: p["subcollectors"][0]["workers"][1]["kwargs"]["transforms"].pop(),
     "subcollectors[0].workers[1].kwargs.transforms"),
    (lambda p: p["env"].pop("transforms_at"), "env"),
    (lambda p: p["env"].__setitem__("transforms_at", "subcollector"), "subcollectors[0].workers[0].kwargs.transforms"),
])
def test_a_row_whose_stack_is_not_the_plans_is_refused(edit, where):
    plan = json.loads(dumps(compiled(spec_text())))
    edit(plan)
    with pytest.raises(SpecError) as caught:
        check_plan(plan, allow_edited=True)
    assert where in [d.dotted_path for d in caught.value.diagnostics]


def test_a_constructor_taking_any_kwargs_is_not_second_guessed():
    from topo.compiler.validate import validate

    text = spec_text().replace("    - SuccessReward\n", "    - MultiAction.from_vla: {stack_rewards: false, chunk_key: c}\n"
                                                       "    - SuccessReward:\n")
    assert validate(parse(text, "toy.yaml")).diagnostics == []


def test_a_callable_is_listed_with_the_code_the_plan_names():
    from topo.compiler.imports import callables

    plan = compiled(spec_text().replace("    - SuccessReward\n", "    - topo.envs.toy:build: {n: 1}\n"))
    assert callables(plan)["topo.envs.toy:build"] == "env builder"  # listed once, under its first role
    plan = compiled(spec_text().replace("    - SuccessReward\n", "    - topo.worker:make_env\n"))
    assert callables(plan)["topo.worker:make_env"] == "env transform"


def test_validating_and_planning_a_stack_imports_no_torch(tmp_path):
    import subprocess
    import sys

    spec = tmp_path / "stack.yaml"
    spec.write_text(spec_text())
    code = f"""
import sys, topo
plan = topo.load({str(spec)!r})
plan.dry_run()
assert not [m for m in ("torch", "torchrl", "tensordict") if m in sys.modules]
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("at, where", [(None, "in each worker"), ("subcollector", "over each subcollector's ParallelEnv")])
def test_the_dry_run_prints_the_stack(at, where):
    from topo.compiler.render import plan_text

    plan = compiled(spec_text(at))
    assert (f"transforms ({where}): MultiAction(stack_rewards=False) -> SuccessReward() -> StepCounter(max_steps=64)"
            in plan_text(plan).splitlines())
    assert json.loads(plan_text(plan, "json"))["env"]["transforms"] == PLANNED
    assert "transforms" not in plan_text(compiled(HEAD))


def test_transforms_at_without_transforms_is_a_warning_and_kwarg_names_are_text():
    from topo.compiler.validate import validate

    found = validate(parse(HEAD.replace("{backend: toy}", "{backend: toy, transforms_at: subcollector}"), "t.yaml"))
    assert [(d.code, d.severity) for d in found.diagnostics] == [("transforms-at-unused", "warning")]
    found = validate(parse(spec_text().replace("{max_steps: 64}", "{1: 64}"), "t.yaml"))
    assert [(d.code, d.dotted_path, d.line) for d in found.errors] == [
        ("transform-kwarg-name", "env.transforms[2].StepCounter[1]", 7)]


def test_a_plan_whose_stack_nests_too_deep_is_refused():
    plan = json.loads(dumps(compiled(spec_text())))
    deep: dict = {}
    for _ in range(110):
        deep = {"k": deep}
    plan["env"]["transforms"][0]["kwargs"] = deep
    for row in rows(plan):
        row["kwargs"]["transforms"][0]["kwargs"] = deep
    with pytest.raises(SpecError) as caught:
        check_plan(plan, allow_edited=True)
    assert [d.code for d in caught.value.diagnostics] == ["plan-too-deep"]
