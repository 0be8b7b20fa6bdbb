"""Several LIBERO suites in one topology: task items qualified by their suite ('libero_object:3'), "suite:id" keys
in multi-suite plans, each row's env kwargs naming its suite, and one-suite specs unchanged."""
from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from topo.backends.base import TaskCatalog
from topo.cli import main
from topo.compiler.spec import empty_range, split_item
from topo.diagnostics import ids_text, task_order
from topo.launch.evaluation.results import summarise, table
from topo.runs.top import task_keys

from tests.compiler.compiler_helpers import EXAMPLES, SPATIAL, checked_of, compile_dict, libero, rows

TWO = EXAMPLES / "libero_two_suites.yaml"
OBJECT = ["pick up the alphabet soup and place it in the basket", "pick up the cream cheese and place it in the basket"]
GOAL = ["open the middle drawer of the cabinet", "put the bowl on the stove"]


def test_the_dry_run_names_each_rows_suite():
    result = CliRunner().invoke(main, ["plan", str(TWO), "--dry-run"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line for line in lines if line.split()[:1] in (["0"], ["1"]) and "fixed:0" in line] == [
        "0  0  libero_spatial:0                0     0  fixed:0    -  pick up the black bowl between the plate and the ramekin...",
        "1  1  libero_spatial:1          1000000     1  fixed:0    -  pick up the black bowl next to the ramekin and place it ...",
        "0  2  libero_object:0          2000000     2  fixed:0    -  pick up the alphabet soup and place it in the basket",
        "1  3  libero_object:1          3000000     3  fixed:0    -  pick up the cream cheese and place it in the basket",
    ]
    at = lines.index("coverage:")
    assert lines[at + 1:at + 4] == ["  tasks: 4, workers per task 1 (even)", "    libero_object: 0:1, 1:1",
                                    "    libero_spatial: 0:1, 1:1"]
    assert "    libero_goal:0: 1 episode(s) (1 init state x 1 trial), held out: open the middle drawer of the cabinet" \
        in lines
    assert "0  0         1         0..0   4..4  libero_goal:0" in lines


def test_rows_carry_their_suite_and_the_eval_schedule_its_builder_input():
    plan = compile_dict(yaml.safe_load(TWO.read_text()))
    got = [(r["task_id"], r["kwargs"]["env"]["task_suite"], r["kwargs"]["env"]["task_id"], r["instruction"])
           for r in rows(plan)]
    assert got == [("libero_spatial:0", "libero_spatial", 0, SPATIAL[0]), ("libero_spatial:1", "libero_spatial", 1, SPATIAL[1]),
                   ("libero_object:0", "libero_object", 0, OBJECT[0]), ("libero_object:1", "libero_object", 1, OBJECT[1])]
    assert [t["task_id"] for t in plan["coverage"]["tasks"]] == ["libero_object:0", "libero_object:1",
                                                                  "libero_spatial:0", "libero_spatial:1"]
    ev = plan["eval"]
    assert ev["tasks"] == ev["held_out"] == ["libero_goal:0", "libero_goal:1"]
    for g, row in enumerate(ev["subcollectors"][0]["workers"]):
        env = row["kwargs"]["schedule"]["envs"][f"libero_goal:{g}"]
        assert (env["task_suite"], env["task_id"], env["instruction"], env["max_episode_steps"]) == \
            ("libero_goal", g, GOAL[g], 4)
        assert row["kwargs"]["env"] == env and row["tasks"] == [f"libero_goal:{g}"]
    assert plan["env"]["kwargs"]["task_suite"] == "libero_spatial"  # as written


def test_a_one_suite_spec_keeps_int_ids_and_its_plan():
    """Items qualified by env.kwargs.task_suite itself are the plain ids: the same plan, byte for byte."""
    plain = libero(1, 4, tasks=[0, "1-2", 3], instructions={2: "two"})
    qualified = libero(1, 4, tasks=["libero_spatial:0", "libero_spatial:1-2", 3], instructions={"libero_spatial:2": "two"})
    plain["eval"] = {"tasks": "4-5", "init_states": 0}
    qualified["eval"] = {"tasks": "libero_spatial:4-5", "init_states": 0}
    a, b = compile_dict(plain), compile_dict(qualified)
    a.pop("spec"), b.pop("spec")
    assert json.dumps(a) == json.dumps(b)
    assert [r["task_id"] for r in rows(a)] == [0, 1, 2, 3] and rows(a)[2]["instruction"] == "two"


def test_all_of_a_suite_blocks_and_instructions():
    data = libero(2, 6, tasks=["libero_10:all", "libero_goal:1-2"], instructions={"libero_goal:1": "the stove"})
    plan = compile_dict(data)
    assert [r["task_id"] for r in rows(plan)] == [f"libero_10:{i}" for i in range(10)] + ["libero_goal:1", "libero_goal:2"]
    assert rows(plan)[10]["instruction"] == "the stove"
    data = libero(1, 3, blocks=[{"task": 2, "workers": 1}, {"task": "libero_object:1", "workers": 2}])
    got = [(r["task_id"], r["kwargs"]["env"]["task_suite"], r["instruction"]) for r in rows(compile_dict(data))]
    assert got == [("libero_spatial:2", "libero_spatial", SPATIAL[2])] + [("libero_object:1", "libero_object", OBJECT[1])] * 2


def test_a_block_that_sets_the_suite_is_told_to_qualify_its_task():
    data = libero(1, 2, blocks=[{"task": 0, "workers": 2, "kwargs": {"task_suite": "libero_object"}}])
    (d,) = [d for d in checked_of(data)[1].errors if d.code == "block-changes-catalog"]
    assert d.hint == "qualify the block's task by its suite instead, e.g. task: 'libero_object:3'"


def test_items_keys_and_their_text():
    assert [split_item(i) for i in (3, "0-2", "libero_10:all", " libero_goal : 1-2 ", "a:b:c", ":3", "x:")] == [
        (None, 3), (None, "0-2"), ("libero_10", "all"), ("libero_goal", "1-2"), None, None, None]
    assert empty_range("libero_goal:9-2") == ("9", "2", "libero_goal:2-9") and empty_range("9-2") == ("9", "2", "2-9")
    assert empty_range("libero_goal:2-9") is None and empty_range(4) is None
    assert ids_text(["a:0", "a:1", "a:2", "b:1", "b:3"]) == "a:0-2, b:1, b:3" and ids_text([0, 1, 3]) == "0-1, 3"
    assert sorted(["a:10", None, "b:0", "a:2"], key=task_order) == ["a:2", "a:10", "b:0", None]
    one = TaskCatalog((0, 1), {0: "x", 1: "y"}, {0: 50, 1: 40}, "s")
    union = TaskCatalog.union({"s": one, "t": TaskCatalog((0,), {0: "z"}, {0: 5}, "t")})
    assert (union.ids, union.language["t:0"], union.init_states["s:1"], union.source) == (("s:0", "s:1", "t:0"), "z", 40,
                                                                                         "s + t")
    assert union.extent(["t:4"]) == ("t has 1 tasks, 0", "use t:0")
    assert one.extent([5]) == ("s has 2 tasks, 0-1", "use ids in 0-1")


def test_eval_results_and_the_report_name_the_suites():
    section = {"held_out": ["libero_goal:0", "libero_goal:1"]}
    planned = {n: (0, n % 2, {"episode": n, "task_id": task, "instruction": text, "init_state_id": 0, "trial": 0,
                              "seed": n})
               for n, (task, text) in enumerate([("libero_goal:0", GOAL[0]), ("libero_goal:1", GOAL[1]),
                                                 ("libero_object:0", OBJECT[0])])}
    ended = {n: {"success": n == 1, "length": 4, "return": 0.0, "init_state_applied": 0, "checksum": 0.0,
                 "acting_version": 0} for n in planned}
    result = summarise(section, planned, ended, round_=1, step=None, version=0, acting_version=0, seconds=1.0)
    assert [(s["suite"], s["tasks"], s["episodes"], s["successes"], s["mean_length"]) for s in result["suites"]] == [
        ("libero_goal", 2, 2, 1, 4.0), ("libero_object", 1, 1, 0, 4.0)]
    lines = table(result).splitlines()
    assert lines[2].startswith("    libero_goal:0  yes") and "  suite libero_goal: 1/2 episodes over 2 task(s), 50.0%" \
        in "\n".join(lines)
    assert "suites" not in summarise({}, {0: (0, 0, {"episode": 0, "task_id": 3})}, {}, round_=1, step=None,
                                     version=0, acting_version=0, seconds=1.0)


def test_task_options_read_suite_keys():
    """``topo top --task`` and ``topo runs show --task``: an id, or a multi-suite plan's "suite:id"."""
    assert task_keys(None, None, ("3", "libero_goal:1")) == (3, "libero_goal:1")
    assert task_keys(None, None, "libero_goal:1") == "libero_goal:1" and task_keys(None, None, None) is None
