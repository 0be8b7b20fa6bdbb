"""Rules through the Python API: what must pass, what must be reported, and the arithmetic in the messages."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import topo
from topo.compiler.load import parse

from tests.compiler.compiler_helpers import checked_of, codes, compile_dict, libero, spec_text, toy


def messages(data, code):
    return [d.message for d in checked_of(data)[1].diagnostics if d.code == code]


def test_block_kwargs_equal_to_the_backend_default_do_not_differ():
    # LiberoEnv's camera_height defaults to 256: a block that writes 256 changes nothing
    data = libero(1, 4, blocks=[{"task": 0, "workers": 2}, {"task": 1, "workers": 2, "kwargs": {"camera_height": 128}}])
    data["env"]["kwargs"].pop("camera_height")
    assert "schema-kwargs-differ" in codes(data)
    data["assignment"]["blocks"][1]["kwargs"]["camera_height"] = 256
    assert codes(data) == []


def test_schema_kwargs_may_differ_across_subcollectors():
    data = libero(2, 2, blocks=[{"task": 0, "workers": 2, "kwargs": {"camera_height": 64}},
                                {"task": 1, "workers": 2, "kwargs": {"camera_height": 128}}])
    plan = compile_dict(data)
    heights = [r["kwargs"]["env"]["camera_height"] for s in plan["subcollectors"] for r in s["workers"]]
    assert heights == [64, 64, 128, 128]


def test_non_json_values_are_reported_not_crashed_on():
    for kwargs, fragment in (({1: "x"}, "key 1 is an integer"), ({"x": float("nan")}, "nan is a non-finite number"),
                             ({"x": [1, {"y": float("inf")}]}, "inf is a non-finite number")):
        data = toy(1, 1)
        data["env"]["kwargs"] = kwargs
        found = checked_of(data)[1]
        assert [d.code for d in found.diagnostics] == ["value-not-json"], kwargs
        assert fragment in found.diagnostics[0].message


def test_integer_instruction_keys_are_fine():
    data = toy(1, 2, tasks="0-1", instructions={0: "a", 1: "b"})
    assert codes(data) == []


def test_schema_errors_keep_the_backend_checks():
    data = toy(1, 1)
    data["env"] = {"backend": "libero", "kwargs": {"task_suite": "libero_spatail", "task_id": 1}}
    data["topology"]["subcollectors"] = 0
    checked = checked_of(data)[1]
    assert checked.spec is None
    assert sorted(d.code for d in checked.diagnostics) == ["kwargs-reserved", "libero-unknown-suite", "schema-minimum"]


def test_compile_source_strict():
    source = parse(spec_text(toy(1, 5, tasks="0-3")), "uneven.yaml")
    assert topo.compile_source(source)["coverage"]["workers"] == 5
    try:
        topo.compile_source(source, strict=True)
    except topo.SpecError as err:
        assert [d.code for d in err.diagnostics] == ["task-coverage-uneven"]
        assert err.exit_code == 2
    else:
        raise AssertionError("strict compile accepted a warning")


def test_tasks_all_on_libero_is_the_whole_suite():
    plan = compile_dict(libero(1, 10, tasks="all"))
    assert [r["task_id"] for r in plan["subcollectors"][0]["workers"]] == list(range(10))


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 200), size=st.integers(2, 16), subs=st.integers(1, 6))
def test_group_size_arithmetic(workers, size, subs):
    data = toy(subs, workers, groups={"size": size, "parallel_repeats": True}, init_states={"mode": "cycle"})
    found = messages(data, "group-size-divides-workers")
    if workers % size:
        assert len(found) == 1
        assert f"{workers} workers per subcollector, not a multiple of group size {size} " \
               f"({workers} % {size} = {workers % size})" in found[0]
    else:
        assert found == []
        plan = compile_dict(data)
        assert plan["coverage"]["groups"]["incomplete"] == []


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 12), candidate=st.integers(1, 40))
def test_candidate_size_arithmetic(size, candidate):
    data = toy(1, size, groups={"size": size, "candidate_size": candidate})
    found = messages(data, "candidate-size-multiple")
    if candidate % size:
        assert found == [f"candidate_size {candidate} is not a multiple of group size {size} "
                         f"({candidate} % {size} = {candidate % size})"]
    else:
        assert found == []


@settings(max_examples=60, deadline=None)
@given(total=st.integers(1, 40), tasks=st.integers(1, 12))
def test_task_coverage_boundary(total, tasks):
    data = toy(1, total, tasks=f"0-{tasks - 1}")
    found = codes(data)
    if total < tasks:
        assert "task-coverage" in found
    elif total % tasks:
        assert found == ["task-coverage-uneven"]
    else:
        assert found == []


def test_fork_for_rendering_workers_is_a_warning_with_the_way_to_measure():
    data = libero(1, 2, tasks="0-1")
    data["topology"]["start_method"] = {"workers": "fork"}
    (found,) = [d for d in checked_of(data)[1].diagnostics if d.code == "fork-with-rendering"]
    assert found.severity == "warning" and found.path == ("topology", "start_method", "workers")
    assert "--modes forkserver-preload,fork" in found.hint
    assert compile_dict(data)["start_methods"]["workers"] == "fork"
    data["env"]["backend"] = "toy"
    data["env"]["kwargs"] = {}
    assert "fork-with-rendering" not in codes(data)  # toy renders nothing
