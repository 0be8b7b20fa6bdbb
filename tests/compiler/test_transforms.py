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
