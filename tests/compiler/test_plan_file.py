"""Saved plans are input: checked as strictly as specs, each problem naming its field, and sealed by a digest."""
from __future__ import annotations

import copy
import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import topo
from topo.bench.modes import MODES, variant
from topo.errors import SpecError, StalePlanError
from topo.compiler.saved import resolve
from topo.compiler.saved import check_plan, read_plan
from topo.compiler.load import parse
from topo.compiler.plan import dumps
from topo.compiler.planfile import MAX_REPORTED, digest, seal

from tests.compiler.compiler_helpers import EXAMPLES
from tests.compiler.hostile_inputs import HEAD, argv, environment
from tests.compiler.hostile_inputs import Case


@pytest.fixture
def plan() -> dict:
    """A 2 x 3 toy plan as `topo plan -o` writes it (sealed)."""
    return json.loads(dumps(topo.compile_source(parse(HEAD, "toy.yaml"))))


def saved(tmp_path, plan: dict, name: str = "plan.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(plan))
    return str(path)


def refused(path: str, **kwargs) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        read_plan(path, **kwargs)
    assert all(d.file == path for d in caught.value.diagnostics)
    return [(d.code, d.dotted_path) for d in caught.value.diagnostics]


def test_a_written_plan_reads_back(tmp_path):
    text = dumps(topo.compile_source(parse(HEAD, "toy.yaml")))
    path = tmp_path / "plan.json"
    path.write_text(text)
    warnings = []
    plan = read_plan(str(path), warnings=warnings)
    assert warnings == [] and dumps(plan) == text
    assert list(plan)[-1] == "digest" and plan["digest"] == digest(plan)
    assert set(plan["digest"]["parts"]) == {key for key in plan if key not in ("digest", "subcollectors")} | {
        "subcollectors[0]", "subcollectors[1]"}


def test_every_example_plan_passes_its_own_check(tmp_path):
    for spec in sorted(EXAMPLES.glob("*.yaml")):
        compiled = topo.compile_spec(spec)
        assert check_plan(compiled) == []  # fresh from the compiler: no digest needed
        path = tmp_path / f"{spec.stem}.json"
        path.write_text(dumps(compiled))
        assert read_plan(str(path)) == seal(compiled)


def test_bench_variants_are_sealed_anew(tmp_path, plan):
    for mode in MODES:
        path = tmp_path / f"{mode}.json"
        path.write_text(dumps(variant(plan, mode, cap=2)))
        assert read_plan(str(path))["name"] == f"{plan['name']} [{mode}]"


@pytest.mark.parametrize("edit, expected", [
    (lambda p: p["subcollectors"][0]["workers"][1].__setitem__("seed", "1"),
     ("plan-schema-type", "subcollectors[0].workers[1].seed")),
    (lambda p: p["subcollectors"][0]["workers"][1].__setitem__("seed", 2**63),
     ("plan-schema-maximum", "subcollectors[0].workers[1].seed")),
    (lambda p: p["launch"].__setitem__("startup_timeout", 1e300), ("plan-schema-maximum", "launch.startup_timeout")),
    (lambda p: p["launch"].__setitem__("startup_timeout", -1), ("plan-schema-exclusiveminimum", "launch.startup_timeout")),
    (lambda p: p["subcollectors"][1]["workers"][0].pop("kwargs"), ("plan-schema-required", "subcollectors[1].workers[0]")),
    (lambda p: p["subcollectors"][1]["workers"][0]["kwargs"].__setitem__("sed", 1),
     ("plan-schema-unknown-key", "subcollectors[1].workers[0].kwargs.sed")),
    (lambda p: p.__setitem__("luanch", {}), ("plan-schema-unknown-key", "luanch")),
    (lambda p: p["start_methods"].__setitem__("workers", "thread"), ("plan-schema-enum", "start_methods.workers")),
    (lambda p: p["subcollectors"][1]["workers"].pop(), ("plan-inconsistent", "subcollectors[1].num_workers")),
    (lambda p: p["subcollectors"][1].__setitem__("index", 0), ("plan-inconsistent", "subcollectors[1].index")),
    (lambda p: p["subcollectors"][1]["workers"][2].__setitem__("global_index", 6),
     ("plan-inconsistent", "subcollectors[1].workers[2].global_index")),
    (lambda p: p["subcollectors"][0]["workers"][0].__setitem__("seed", 9),
     ("plan-inconsistent", "subcollectors[0].workers[0].kwargs.seed")),
    (lambda p: p["subcollectors"][0]["workers"][0]["kwargs"]["worker"].__setitem__("index", 2),
     ("plan-inconsistent", "subcollectors[0].workers[0].kwargs.worker")),
    (lambda p: p["env"].__setitem__("builder", "topo.envs.gym:build"),
     ("plan-inconsistent", "subcollectors[0].workers[0].kwargs.builder")),
    (lambda p: p["placement"]["subcollectors"].pop(), ("plan-inconsistent", "placement.subcollectors")),
])
def test_a_malformed_plan_names_the_field(tmp_path, plan, edit, expected):
    edit(plan)
    found = refused(saved(tmp_path, plan))
    assert found[0] == expected, found
    with pytest.raises(SpecError):  # the same check, in memory, even allowing edits
        check_plan(plan, allow_edited=True)


def test_bad_rows_are_listed_up_to_a_limit(tmp_path):
    many = json.loads(dumps(topo.compile_source(parse(HEAD.replace("3}", "40}"), "toy.yaml"))))
    for row in many["subcollectors"][1]["workers"]:
        row["seed"] = -1
    found = refused(saved(tmp_path, many))
    assert len(found) == MAX_REPORTED + 1
    assert found[-1] == ("plan-schema-rows", f"subcollectors[1].workers[{MAX_REPORTED}]")


def test_an_edited_plan_is_refused_unless_allowed(tmp_path, plan):
    plan["subcollectors"][1]["workers"][0]["task_id"] = 3
    plan["launch"]["startup_timeout"] = 60
    path = saved(tmp_path, plan)
    with pytest.raises(SpecError) as caught:
        read_plan(path)
    (d,) = caught.value.diagnostics
    assert d.code == "plan-edited" and "launch, subcollectors[1] no longer match" in d.message
    assert "--allow-edited-plan" in d.hint
    warnings = []
    assert read_plan(path, allow_edited=True, warnings=warnings)["launch"]["startup_timeout"] == 60
    assert [(w.code, w.severity) for w in warnings] == [("plan-edited", "warning")]
    with pytest.raises(SpecError):
        check_plan(plan)
    assert [w.code for w in check_plan(plan, allow_edited=True)] == ["plan-edited"]


def test_a_plan_without_digest(tmp_path, plan):
    del plan["digest"]
    path = saved(tmp_path, plan)
    assert refused(path) == [("plan-no-digest", "digest")]
    assert [w.code for w in _warnings(path)] == ["plan-no-digest"]
    assert check_plan(plan) == []  # in memory, as compile_spec returns it


def _warnings(path: str) -> list:
    out = []
    read_plan(path, allow_edited=True, warnings=out)
    return out


def test_removed_subcollector_is_named(tmp_path):
    three = json.loads(dumps(topo.compile_source(parse(HEAD.replace("subcollectors: 2", "subcollectors: 3"), "t.yaml"))))
    two = json.loads(dumps(topo.compile_source(parse(HEAD, "t.yaml"))))
    two["digest"] = three["digest"]
    two["spec"] = three["spec"]
    with pytest.raises(SpecError) as caught:
        read_plan(saved(tmp_path, two))
    assert "subcollectors[2] (removed)" in caught.value.diagnostics[0].message


def test_not_json_and_not_a_plan(tmp_path, plan):
    broken = tmp_path / "broken.json"
    broken.write_text(dumps(plan)[:-40])
    assert refused(str(broken)) == [("plan-syntax", "<root>")]
    nan = tmp_path / "nan.json"
    nan.write_text(dumps(plan).replace('"startup_timeout": 900.0', '"startup_timeout": NaN'))
    assert refused(str(nan)) == [("plan-syntax", "<root>")]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"version": 1}))
    assert read_plan(str(spec)) is None  # JSON, but a spec
    assert read_plan(str(tmp_path / "missing.json")) is None


def test_other_formats_are_stale(tmp_path, plan):
    with pytest.raises(StalePlanError, match="re-run `topo plan`"):
        read_plan(saved(tmp_path, {**plan, "format": "topo.plan/0"}))
    with pytest.raises(StalePlanError, match="topo 99.0.0"):
        read_plan(saved(tmp_path, {**plan, "topo_version": "99.0.0"}))


def test_launch_refuses_before_starting_anything(tmp_path, plan):
    plan["subcollectors"][0]["workers"][0]["instruction"] = "open the door"
    path = saved(tmp_path, plan)
    python, *rest = argv(Case("", ("launch", path), "", ""))
    result = subprocess.run([python, "-X", "importtime", *rest], capture_output=True, text=True,
                            env=environment(), timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert not [line for line in result.stderr.splitlines() if line.split("|")[-1].strip() == "torch"]  # refused first
    assert f"{path}: error plan-edited at digest: the plan was changed after topo wrote it: subcollectors[0]" \
        in result.stderr
    assert resolve(path, allow_edited=True, quiet=True)["subcollectors"][0]["workers"][0]["instruction"] == \
        "open the door"


def test_allow_edited_plan_is_for_plans_only(tmp_path):
    spec = tmp_path / "toy.yaml"
    spec.write_text(HEAD)
    result = subprocess.run(argv(Case("", ("launch", str(spec), "--allow-edited-plan"), "", "")),
                            capture_output=True, text=True, env=environment(), timeout=120)
    assert result.returncode == 2 and "only apply to a saved plan" in result.stderr


def test_digest_is_of_the_content_alone(plan):
    again = copy.deepcopy(plan)
    again["digest"] = {"sha256": "0" * 64, "parts": {}}
    assert digest(again) == plan["digest"]
    assert seal(again) == plan


# --- the quick schema check never says yes where jsonschema says no ------------------------------------

_PLAN = json.loads(dumps(topo.compile_source(parse(HEAD + "placement: {engine: ray, resources: {memory_gb: 2}}\n",
                                                   "toy.yaml"))))
_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False), st.text(max_size=4), st.sampled_from(["spawn", "cycle", "a:b", "f" * 64]),
                    st.lists(st.integers(0, 2), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(node, path=()):
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in children:
        yield from _paths(value, path + (key,))


@st.composite
def _mutated_plans(draw):
    plan = copy.deepcopy(_PLAN)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from([p for p in _paths(plan) if p]))
        parent = plan
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(_LEAVES)
    return plan


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_plans())
def test_quick_schema_agrees_with_jsonschema(plan):
    from topo.compiler import schema
    from topo.compiler.planfile import SCHEMA_FILE

    assert schema.quick(SCHEMA_FILE)(plan) == (not schema.violations(plan, SCHEMA_FILE))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_plans())
def test_a_mutated_plan_is_refused_or_runs_never_crashes(plan):
    try:
        check_plan(plan, allow_edited=True)
    except (SpecError, StalePlanError) as err:
        assert err.exit_code == 2


def test_a_rows_kwargs_block_is_what_the_worker_takes_and_its_fields_are_the_assignments():
    import inspect
    import typing

    from topo.backends.base import Assignment
    from topo.compiler.row import Kwargs, Row
    from topo.worker import make_env

    taken = {n for n, p in inspect.signature(make_env).parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert set(typing.get_type_hints(Kwargs)) == taken  # the kwargs block is passed to the worker as is
    assert set(Assignment._fields) - {"kwargs"} <= set(typing.get_type_hints(Row))


def test_the_plan_schema_holds_the_rows_row_py_declares():
    import json
    import typing
    from pathlib import Path

    from topo.compiler.row import EvalRow, Kwargs, Row

    schema = json.loads((Path(__file__).resolve().parents[2] / "topo/compiler/schemas/topo-plan.schema.json").read_text())
    rows = schema["$defs"]
    assert set(rows["row"]["properties"]) == set(typing.get_type_hints(Row))
    assert set(rows["eval_row"]["properties"]) == set(typing.get_type_hints(EvalRow))
    assert set(rows["eval_row"]["properties"]["kwargs"]["properties"]) == set(typing.get_type_hints(Kwargs))
    assert set(rows["row"]["properties"]["kwargs"]["properties"]) == set(typing.get_type_hints(Kwargs)) - {"schedule"}
