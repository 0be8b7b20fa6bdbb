"""The recipe formulas, row by row, on several topologies.

Every expectation is computed here from the formulas of torchrl's vla_grpo LIBERO recipe
(/work/shared/notes/torchrl.md), never by calling topo.compiler.assign:

    g = offset(c) + w                      offset(c) = workers of subcollectors 0..c-1
    seed = base + g
    no parallel repeats: task = tasks[g % T],        group_id_offset = g * 10**6,
                         group_repeats = candidate_size (None without groups), mode = episode
    parallel repeats:    logical = g // size, task = tasks[logical % T],
                         group_id_offset = logical * 10**6, group_repeats = candidate // size,
                         mode = init_state
    render_gpu = render_gpus[c % len(render_gpus)]
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.compiler.compiler_helpers import (EXAMPLES, GOAL, GROUP_ID_OFFSET, LIBERO_10_TASK_0, SPATIAL, assert_layout,
                              compile_dict, libero, rows, toy)

import topo


# --- the production topology: libero_spatial 5 x 64, groups of 8 ---------------------------------

@pytest.fixture(scope="module")
def plan_5x64():
    return topo.compile_spec(EXAMPLES / "libero_spatial_5x64.yaml")


def test_5x64_every_row(plan_5x64):
    assert_layout(plan_5x64, [64] * 5)
    tasks = list(range(8))
    for row in rows(plan_5x64):
        c, w, g = row["subcollector"], row["index"], row["global_index"]
        assert g == c * 64 + w
        logical = g // 8
        task = tasks[logical % len(tasks)]
        assert row["task_id"] == task
        assert row["seed"] == 0 + g
        assert row["group_id_offset"] == logical * 10**6
        assert row["group"] == logical
        assert row["group_repeats"] == 16 // 8
        assert row["group_id_mode"] == "init_state"
        assert row["render_gpu"] == [0, 1, 2, 3, 4][c % 5]
        assert (row["init_state_mode"], row["init_state_id"]) == ("cycle", 0)
        assert row["instruction"] == SPATIAL[task]
        assert row["kwargs"]["seed"] == g and row["kwargs"]["render_gpu"] == c
        assert row["kwargs"]["backend"] == "libero" and row["kwargs"]["builder"] == "topo.envs.libero:build"
    assert [s["render_gpu"] for s in plan_5x64["subcollectors"]] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("c, w", [(0, 0), (0, 9), (2, 17), (4, 63)])
def test_5x64_exact_env_kwargs(plan_5x64, c, w):
    g = c * 64 + w
    task = (g // 8) % 8
    row = plan_5x64["subcollectors"][c]["workers"][w]
    assert row["kwargs"]["env"] == {
        "task_suite": "libero_spatial", "camera_height": 256, "camera_width": 256, "max_episode_steps": 512,
        "task_id": task, "instruction": SPATIAL[task],
        "init_state_mode": "cycle", "init_state_id": 0,
        "group_repeats": 2, "group_id_offset": (g // 8) * GROUP_ID_OFFSET, "group_id_mode": "init_state",
        "env_kwargs": {},
        "options": {"model_cache": True, "skip_unread_renders": True, "reset_gripper": True, "fixtures_by_init_state": True},
    }


def test_4x80_is_the_recipes_committed_config():
    """examples/libero_spatial_4x80.yaml: torchrl's config as committed (tests/compiler/test_import.py imports it)."""
    plan = topo.compile_spec(EXAMPLES / "libero_spatial_4x80.yaml")
    assert_layout(plan, [80] * 4)
    for row in rows(plan):
        g, c = row["global_index"], row["subcollector"]
        logical = g // 8
        assert row["task_id"] == logical % 10  # task_ids 0-9
        assert row["group_id_offset"] == logical * GROUP_ID_OFFSET
        assert row["group_repeats"] == 1 and row["group_id_mode"] == "init_state"  # candidate null: 8 // 8
        assert row["seed"] == g
        assert (row["render_gpu"], row["render_numbering"]) == ([2, 3, 4, 5][c % 4], "egl")
        assert row["instruction"] == SPATIAL[logical % 10]
    # 40 groups over 10 tasks: 4 groups (32 workers) each
    assert [(t["task_id"], t["workers"], t["groups"]) for t in plan["coverage"]["tasks"]] == \
        [(t, 32, 4) for t in range(10)]


def test_tasks_all_is_the_whole_suite_in_order():
    groups = {"size": 8, "parallel_repeats": True}
    every = compile_dict(libero(4, 80, tasks="all", groups=groups, init_states={"mode": "cycle"}))
    listed = compile_dict(libero(4, 80, tasks="0-9", groups=groups, init_states={"mode": "cycle"}))
    assert [r["task_id"] for r in rows(every)] == [r["task_id"] for r in rows(listed)] == \
        [(g // 8) % 10 for g in range(320)]


# --- libero without parallel repeats: eval-style --------------------------------------------------

def test_libero_without_parallel_repeats():
    tasks = [1, 3, 5]
    data = libero(2, 5, suite="libero_goal", tasks=tasks, groups={"size": 4, "candidate_size": 8},
                  init_states={"mode": "fixed", "id": 49}, seeds={"base": 1000}, render_gpus=[3],
                  instructions={3: "open the drawer, bowl in"})
    data["collector"] = {"frames_per_batch": 10}
    data["env"]["options"] = {"model_cache": "/scratch/mujoco", "reset_gripper": False}
    plan = compile_dict(data)
    assert_layout(plan, [5, 5])
    for row in rows(plan):
        g = row["global_index"]
        task = tasks[g % 3]
        assert row["task_id"] == task
        assert row["group_id_offset"] == g * 10**6
        assert row["group_repeats"] == 8  # candidate_size, as given
        assert row["group_id_mode"] == "episode"
        assert row["seed"] == 1000 + g
        assert row["render_gpu"] == 3  # [3][c % 1]
        assert (row["init_state_mode"], row["init_state_id"]) == ("fixed", 49)
        assert row["instruction"] == ("open the drawer, bowl in" if task == 3 else GOAL[task])
    row = plan["subcollectors"][1]["workers"][2]  # g = 7: task tasks[7 % 3] = 3, overridden instruction
    assert row["kwargs"]["env"] == {
        "task_suite": "libero_goal", "camera_height": 128, "camera_width": 128, "max_episode_steps": 512,
        "task_id": 3, "instruction": "open the drawer, bowl in", "init_state_mode": "fixed", "init_state_id": 49,
        "group_repeats": 8, "group_id_offset": 7_000_000, "group_id_mode": "episode", "env_kwargs": {},
        "options": {"model_cache": "/scratch/mujoco", "skip_unread_renders": True, "reset_gripper": False,
                    "fixtures_by_init_state": True},
    }
    assert plan["env"]["options"] == row["kwargs"]["env"]["options"]
    assert row["kwargs"]["seed"] == 1007 and row["kwargs"]["render_gpu"] == 3


def test_libero_10_language_drops_the_scene_prefix():
    plan = compile_dict(libero(1, 2, suite="libero_10", tasks=[0, 0]))
    assert [r["instruction"] for r in rows(plan)] == [LIBERO_10_TASK_0] * 2


def test_libero_block_kwargs_and_env_kwargs_in_rows():
    data = libero(2, 2, tasks=None, blocks=[
        {"task": 4, "workers": 2, "kwargs": {"env_kwargs": {"hard_reset": False}}},
        {"task": 9, "workers": 2, "instruction": "put the bowl on the plate"},
    ])
    del data["assignment"]["tasks"]
    plan = compile_dict(data)
    r = rows(plan)
    assert [x["task_id"] for x in r] == [4, 4, 9, 9]
    assert [x["instruction"] for x in r] == [SPATIAL[4], SPATIAL[4]] + ["put the bowl on the plate"] * 2
    assert [x["kwargs"]["env"]["env_kwargs"] for x in r] == [{"hard_reset": False}] * 2 + [{}] * 2
    assert [x["group_id_offset"] for x in r] == [g * GROUP_ID_OFFSET for g in range(4)]
    assert all(x["render_gpu"] is None and x["group_repeats"] is None for x in r)


# --- toy backend -----------------------------------------------------------------------------------

def test_toy_no_groups():
    plan = compile_dict(toy(2, 6, tasks="0-2", seeds={"base": 100}))
    assert_layout(plan, [6, 6])
    for row in rows(plan):
        g = row["global_index"]
        assert row["task_id"] == [0, 1, 2][g % 3]
        assert row["group_id_offset"] == g * GROUP_ID_OFFSET
        assert row["group_repeats"] is None and row["group_id_mode"] == "episode"
        assert row["seed"] == 100 + g
        assert row["instruction"] == f"toy task {g % 3}"
        assert row["render_gpu"] is None
        assert (row["init_state_mode"], row["init_state_id"]) == ("random", 0)
    # no groups section: group_repeats is not passed at all
    assert rows(plan)[7]["kwargs"]["env"] == {"success_steps": 4, "state_dim": 8, "group_id_offset": 7_000_000,
                                               "instruction": "toy task 1"}
    assert plan["groups"] is None


def test_toy_uneven_workers_lists():
    workers = [3, 5, 4]
    tasks = [2, 0, 1]  # "2, 0-1"
    plan = compile_dict(toy(3, workers, tasks=[2, "0-1"], render_gpus=[1, 0], seeds={"base": 7}))
    assert_layout(plan, workers)
    expected_g = {(0, 0): 0, (0, 2): 2, (1, 0): 3, (1, 4): 7, (2, 0): 8, (2, 3): 11}
    for row in rows(plan):
        c, w, g = row["subcollector"], row["index"], row["global_index"]
        if (c, w) in expected_g:
            assert g == expected_g[(c, w)]
        assert row["task_id"] == tasks[g % 3]
        assert row["seed"] == 7 + g
        assert row["render_gpu"] == [1, 0][c % 2]
    assert [s["render_gpu"] for s in plan["subcollectors"]] == [1, 0, 1]
    assert plan["coverage"]["render_gpus"] == [{"render_gpu": 0, "workers": 5}, {"render_gpu": 1, "workers": 7}]


def test_toy_parallel_repeats_uneven_lists():
    workers = [4, 8, 4]
    tasks = [4, 7, 9]
    plan = compile_dict(toy(3, workers, tasks=tasks, groups={"size": 4, "candidate_size": 12, "parallel_repeats": True},
                            init_states={"mode": "cycle", "id": 3}))
    assert_layout(plan, workers)
    for row in rows(plan):
        g = row["global_index"]
        logical = g // 4
        assert row["task_id"] == tasks[logical % 3]
        assert row["group_id_offset"] == logical * GROUP_ID_OFFSET
        assert row["group_repeats"] == 12 // 4
        assert row["group_id_mode"] == "init_state"
        assert (row["init_state_mode"], row["init_state_id"]) == ("cycle", 3)
        assert row["seed"] == g
    assert rows(plan)[13]["kwargs"]["env"] == {"success_steps": 4, "state_dim": 8, "group_id_offset": 3_000_000,
                                                "instruction": "toy task 4", "group_repeats": 3}
    assert plan["coverage"]["groups"] == {"count": 4, "workers_per_group": 4, "complete": 4, "incomplete": []}


def test_toy_groups_without_parallel_repeats():
    plan = compile_dict(toy(1, 4, tasks=[3], groups={"size": 2, "candidate_size": 6}))
    for row in rows(plan):
        g = row["global_index"]
        assert row["group_id_offset"] == g * GROUP_ID_OFFSET
        assert row["group_repeats"] == 6 and row["group_id_mode"] == "episode"
        assert row["kwargs"]["env"]["group_repeats"] == 6


def test_toy_instruction_overrides():
    plan = compile_dict(toy(1, 4, tasks="0-3", instructions={1: "lift", 3: "push"}))
    assert [r["instruction"] for r in rows(plan)] == ["toy task 0", "lift", "toy task 2", "push"]
    assert [r["kwargs"]["env"]["instruction"] for r in rows(plan)] == ["toy task 0", "lift", "toy task 2", "push"]


def test_toy_blocks_layout():
    blocks = [
        {"task": 5, "workers": 4, "kwargs": {"success_steps": 2}},
        {"task": 6, "workers": 3, "instruction": "block six"},
        {"task": 5, "workers": 1},
    ]
    plan = compile_dict(toy(2, 4, blocks=blocks, instructions={5: "five", 6: "six (overridden by the block)"}))
    r = rows(plan)
    assert [x["task_id"] for x in r] == [5, 5, 5, 5, 6, 6, 6, 5]
    assert [x["instruction"] for x in r] == ["five"] * 4 + ["block six"] * 3 + ["five"]
    assert [x["kwargs"]["env"]["success_steps"] for x in r] == [2] * 4 + [4] * 4
    assert [x["group_id_offset"] for x in r] == [g * GROUP_ID_OFFSET for g in range(8)]
    assert r[4]["kwargs"]["env"] == {"success_steps": 4, "state_dim": 8, "group_id_offset": 4_000_000, "instruction": "block six"}


def test_toy_blocks_with_parallel_groups():
    plan = compile_dict(toy(2, 4, blocks=[{"task": 1, "workers": 2}, {"task": 2, "workers": 6}],
                            groups={"size": 2, "parallel_repeats": True}, init_states={"mode": "cycle"}))
    r = rows(plan)
    assert [x["task_id"] for x in r] == [1, 1, 2, 2, 2, 2, 2, 2]
    assert [x["group_id_offset"] for x in r] == [(g // 2) * GROUP_ID_OFFSET for g in range(8)]
    assert {x["group_repeats"] for x in r} == {1}  # candidate_size defaults to size: 2 // 2


def test_sequence_seeds():
    n = 15
    plan = compile_dict(toy(3, 5, seeds={"base": 12345, "strategy": "sequence"}))
    children = np.random.SeedSequence(12345).spawn(n)
    want = [int(child.generate_state(1, np.uint64)[0]) >> 1 for child in children]
    got = [r["seed"] for r in rows(plan)]
    assert got == want
    assert len(set(got)) == n
    assert all(0 <= s < 2**63 for s in got)
    assert got != [12345 + g for g in range(n)]
    assert [r["kwargs"]["seed"] for r in rows(plan)] == want
    assert plan["seeds"] == {"strategy": "sequence", "base": 12345}


def test_sequence_seeds_example_gym():
    plan = topo.compile_spec(EXAMPLES / "gym_halfcheetah.yaml")
    want = [int(c.generate_state(1, np.uint64)[0]) >> 1 for c in np.random.SeedSequence(7).spawn(6)]
    assert [r["seed"] for r in rows(plan)] == want


def test_explicit_seed_list():
    seeds = [9, 3, 7, 1]
    plan = compile_dict(toy(2, 2, seeds={"list": seeds}))
    assert [r["seed"] for r in rows(plan)] == seeds
    assert [r["kwargs"]["seed"] for r in rows(plan)] == seeds
    assert plan["seeds"]["strategy"] == "list"


def test_toy_example_rows():
    plan = topo.compile_spec(EXAMPLES / "toy_2x3.yaml")
    names = ["push the block to the left", "push the block to the right", "lift the block"]
    for row in rows(plan):
        g = row["global_index"]
        assert row["task_id"] == g % 3
        assert row["instruction"] == names[g % 3]
        assert row["seed"] == 100 + g
        assert row["group_repeats"] == 2 and row["group_id_mode"] == "episode"
        assert row["group_id_offset"] == g * GROUP_ID_OFFSET
