"""The eval section of a plan: its rows worker by worker (toy and LIBERO), every (task, init state) exactly
`trials` times for any worker count, seeds apart from training's, determinism, the plan file, the dry run.

Expectations are written out here (episode lists, seeds, kwargs), never computed with topo.compiler.eval_plan.
"""
from __future__ import annotations

import json
import textwrap
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from click.testing import CliRunner

import topo
from topo.cli import main
from topo.errors import SpecError
from topo.compiler.saved import check_plan, read_plan
from topo.compiler.plan import dumps, write
from topo.compiler.planfile import seal

from tests.compiler.compiler_helpers import SPATIAL, checked_of, compile_dict, libero, rows, toy

POLICY = {"factory": "topo.policies.tinyvla:make"}
OPTIONS = {"model_cache": True, "skip_unread_renders": True, "reset_gripper": True, "fixtures_by_init_state": True}


def eval_rows(plan: dict) -> list[dict]:
    return [row for sub in plan["eval"]["subcollectors"] for row in sub["workers"]]


def episode(n: int, task, instruction, state, trial: int, seed: int) -> dict:
    return {"episode": n, "task_id": task, "instruction": instruction, "init_state_id": state, "trial": trial,
            "seed": seed}


def with_eval(data: dict, **section) -> dict:
    return {**data, "policy": POLICY, "eval": section}


# --- exact rows --------------------------------------------------------------------------------------

TOY_EVAL = dict(tasks=[3, 4], trials=5, workers={"subcollectors": 2, "workers_per_subcollector": [2, 1]},
                max_episode_steps=20)


def toy_row(c: int, w: int, g: int, episodes: list[dict]) -> dict:
    tasks = list(dict.fromkeys(e["task_id"] for e in episodes))
    envs = {str(t): {"success_steps": 4, "state_dim": 8, "group_id_offset": 0, "instruction": f"toy task {t}"}
            for t in tasks}
    worker = {"subcollector": c, "index": w, "global_index": g}
    return {**worker, "role": "eval", "tasks": tasks, "episodes": episodes, "render_gpu": None,
            "render_numbering": None,
            "kwargs": {"backend": "toy", "builder": "topo.envs.toy:build", "env": envs[str(tasks[0])],
                       "seed": episodes[0]["seed"], "render_gpu": None, "render_numbering": None,
                       "render_fallback": False, "worker": {**worker, "role": "eval"},
                       "schedule": {"envs": envs, "episodes": episodes, "max_episode_steps": 20}}}


def test_toy_eval_rows_exactly():
    """10 episodes (tasks 3, 4 x 5 trials) over 2 + 1 workers: 4, 3, 3, in order; seeds after the 6 training ones."""
    plan = compile_dict(with_eval(toy(2, 3, tasks=[0, 1, 2]), **TOY_EVAL))
    eps = [episode(n, 3 if n < 5 else 4, f"toy task {3 if n < 5 else 4}", None, n % 5, 6 + n) for n in range(10)]
    assert plan["eval"]["subcollectors"] == [
        {"index": 0, "num_workers": 2, "render_gpu": None,
         "workers": [toy_row(0, 0, 0, eps[0:4]), toy_row(0, 1, 1, eps[4:7])]},
        {"index": 1, "num_workers": 1, "render_gpu": None, "workers": [toy_row(1, 0, 2, eps[7:10])]},
    ]
    ev = plan["eval"]
    assert {k: v for k, v in ev.items() if k not in ("subcollectors", "coverage")} == {
        "tasks": [3, 4], "held_out": [3, 4], "init_states": "all", "trials": 5, "episodes": 10,
        "max_episode_steps": 20, "every": None, "async": False, "busy_policy": "skip",
        "exploration": "deterministic", "policy": "copy", "seeds": {"strategy": "offset", "base": 6}}
    assert ev["coverage"] == {
        "episodes": 10, "workers": 3,
        "tasks": [{"task_id": 3, "instruction": "toy task 3", "episodes": 5, "init_states": None, "held_out": True},
                  {"task_id": 4, "instruction": "toy task 4", "episodes": 5, "init_states": None, "held_out": True}],
        "per_worker": [{"subcollector": 0, "index": 0, "global_index": 0, "episodes": 4, "tasks": [3]},
                       {"subcollector": 0, "index": 1, "global_index": 1, "episodes": 3, "tasks": [3, 4]},
                       {"subcollector": 1, "index": 0, "global_index": 2, "episodes": 3, "tasks": [4]}]}


def libero_env(task: int, state: int) -> dict:
    return {"task_suite": "libero_spatial", "task_id": task, "instruction": SPATIAL[task], "init_state_mode": "fixed",
            "init_state_id": state, "group_repeats": None, "group_id_offset": 0, "group_id_mode": "episode",
            "camera_height": 128, "camera_width": 128, "max_episode_steps": 300, "env_kwargs": {},
            "options": OPTIONS}


def test_libero_eval_rows_exactly():
    """Tasks 2, 3 x init states 0-2 x 2 trials = 12 episodes over 5 workers (3, 3, 2, 2, 2); each task's builder
    input fixes the row's first init state of it, without GRPO groups, at the eval horizon."""
    data = with_eval(libero(1, 4, tasks=[0, 1]), tasks=[2, 3], init_states="0-2", trials=2, workers=5,
                     max_episode_steps=300, render_gpus=[1])
    plan = compile_dict(data)
    order = [(t, s, k) for t in (2, 3) for s in range(3) for k in range(2)]
    eps = [episode(n, t, SPATIAL[t], s, k, 4 + n) for n, (t, s, k) in enumerate(order)]
    spans = [(0, 3), (3, 6), (6, 8), (8, 10), (10, 12)]
    got = eval_rows(plan)
    assert len(got) == 5 and plan["eval"]["subcollectors"][0]["render_gpu"] == 1
    for g, (lo, hi) in enumerate(spans):
        mine = eps[lo:hi]
        task, state = mine[0]["task_id"], mine[0]["init_state_id"]
        worker = {"subcollector": 0, "index": g, "global_index": g}
        assert got[g] == {
            **worker, "role": "eval", "tasks": [task], "episodes": mine, "render_gpu": 1, "render_numbering": "cuda",
            "kwargs": {"backend": "libero", "builder": "topo.envs.libero:build", "env": libero_env(task, state),
                       "seed": 4 + lo, "render_gpu": 1, "render_numbering": "cuda", "render_fallback": False,
                       "worker": {**worker, "role": "eval"},
                       "schedule": {"envs": {str(task): libero_env(task, state)}, "episodes": mine,
                                    "max_episode_steps": 300}}}, g
    assert plan["eval"]["init_states"] == [0, 1, 2] and plan["eval"]["held_out"] == [2, 3]
    assert [t["init_states"] for t in plan["eval"]["coverage"]["tasks"]] == [3, 3]


def test_all_init_states_of_the_catalog():
    """init_states: all (the default) runs each task's own 50 LIBERO init states."""
    plan = compile_dict(with_eval(libero(1, 2, tasks=[0, 1]), tasks=[8, 9], workers=4))
    ev = plan["eval"]
    assert ev["episodes"] == 100 and ev["init_states"] == "all"
    pairs = [(e["task_id"], e["init_state_id"]) for row in eval_rows(plan) for e in row["episodes"]]
    assert pairs == [(t, s) for t in (8, 9) for s in range(50)]
    assert [len(r["episodes"]) for r in eval_rows(plan)] == [25] * 4
    # a row spanning two tasks gets one builder input per task, each at that task's first init state there
    plan = compile_dict(with_eval(libero(1, 2, tasks=[0, 1]), tasks=[8, 9], workers=3))
    middle = eval_rows(plan)[1]  # episodes 34..66: task 8 from init state 34, task 9 from 0
    assert middle["tasks"] == [8, 9] and [middle["episodes"][0]["init_state_id"], middle["episodes"][-1]["init_state_id"]] \
        == [34, 16]
    envs = middle["kwargs"]["schedule"]["envs"]
    assert (envs["8"]["init_state_id"], envs["9"]["init_state_id"]) == (34, 0)
    assert middle["kwargs"]["env"] == envs["8"]


def test_backend_without_tasks_has_one_null_task():
    plan = compile_dict(with_eval(toy(1, 2), trials=3, workers=2))
    ev = plan["eval"]
    assert (ev["tasks"], ev["held_out"], ev["episodes"]) == ([None], [], 3)
    first = eval_rows(plan)[0]
    assert first["tasks"] == [None] and list(first["kwargs"]["schedule"]["envs"]) == ["null"]
    assert [e["trial"] for r in eval_rows(plan) for e in r["episodes"]] == [0, 1, 2]
    assert ev["coverage"]["tasks"] == [{"task_id": None, "instruction": None, "episodes": 3, "init_states": None,
                                        "held_out": False}]


def test_defaults_workers_per_task_and_training_tasks():
    """No eval.workers: one subcollector, one worker per eval task; no eval.tasks: the training tasks (a block
    layout's, each once, in order)."""
    data = with_eval(toy(1, 4, blocks=[{"task": 5, "workers": 2}, {"task": 1, "workers": 1}, {"task": 5, "workers": 1}]),
                     trials=2)
    plan = compile_dict(data)
    assert plan["eval"]["tasks"] == [5, 1] and plan["eval"]["held_out"] == []
    assert [s["num_workers"] for s in plan["eval"]["subcollectors"]] == [2]
    assert [r["tasks"] for r in eval_rows(plan)] == [[5], [1]]
    assert compile_dict(toy(1, 2))["eval"] is None  # no eval section, no eval


# --- seeds ---------------------------------------------------------------------------------------------

def test_default_seeds_start_after_training():
    offset = compile_dict(with_eval(toy(2, 3, tasks=[0, 1], seeds={"base": 100}), tasks=[7], trials=4))
    assert [e["seed"] for r in eval_rows(offset) for e in r["episodes"]] == [106, 107, 108, 109]
    listed = compile_dict(with_eval(toy(1, 3, tasks=[0], seeds={"list": [5, 90, 7]}), tasks=[7], trials=2))
    assert listed["eval"]["seeds"] == {"strategy": "offset", "base": 91}
    assert [e["seed"] for r in eval_rows(listed) for e in r["episodes"]] == [91, 92]


def test_sequence_seeds_are_the_children_after_the_training_ones():
    plan = compile_dict(with_eval(toy(1, 4, tasks=[0], seeds={"base": 7, "strategy": "sequence"}), tasks=[3, 4],
                                  trials=3))
    children = np.random.SeedSequence(7).spawn(4 + 6)
    words = [int(child.generate_state(1, np.uint64)[0]) >> 1 for child in children]
    assert [r["seed"] for r in rows(plan)] == words[:4]
    assert [e["seed"] for r in eval_rows(plan) for e in r["episodes"]] == words[4:]
    assert plan["eval"]["seeds"] == {"strategy": "sequence", "base": 7}


def test_the_recipes_eval_seed_is_refused_and_the_fix_works():
    data = with_eval(toy(2, 4, tasks=[0, 1]), tasks=[2], trials=3, seeds={"base": 1})
    (d,) = [d for d in checked_of(data)[1].diagnostics if d.is_error]
    assert d.code == "eval-seed-overlaps-train" and d.path == ("eval", "seeds", "base") and d.line is not None
    assert "eval seeds 1-3 (3 episodes from base 1) overlap the training seeds 0-7 (8 workers from base 0) on 1-3" \
        in d.message
    fixed = compile_dict(with_eval(toy(2, 4, tasks=[0, 1]), tasks=[2], trials=3, seeds={"base": 8}))
    assert [e["seed"] for r in eval_rows(fixed) for e in r["episodes"]] == [8, 9, 10]


# --- every (task, init state) exactly `trials` times, whatever the worker count -------------------------------

@st.composite
def eval_specs(draw):
    lib = draw(st.booleans())
    tasks = draw(st.lists(st.integers(0, 9), min_size=1, max_size=4, unique=True))
    section: dict = {"tasks": tasks, "trials": draw(st.integers(1, 3))}
    states = None
    if lib and draw(st.booleans()):
        states = sorted(draw(st.lists(st.integers(0, 49), min_size=1, max_size=7, unique=True)))
        section["init_states"] = states
    subs = draw(st.integers(1, 3))
    per = [draw(st.integers(1, 6)) for _ in range(subs)]
    section["workers"] = {"subcollectors": subs, "workers_per_subcollector": per} if subs > 1 or draw(
        st.booleans()) else per[0]
    base = libero(1, 2, tasks=[0]) if lib else toy(1, 2, tasks=[0])
    expected = [(t, s) for t in tasks for s in ((states or range(50)) if lib else [None])]
    return with_eval(base, **section), expected, section["trials"], sum(per)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(eval_specs())
def test_every_pair_runs_exactly_trials_times(case):
    data, pairs, trials, workers = case
    total = len(pairs) * trials
    checked = checked_of(data)[1]
    if workers > total:  # more workers than episodes: refused, never planned idle
        assert [d.code for d in checked.errors] == ["eval-workers-idle"]
        return
    plan = compile_dict(data)
    listed = [e for r in eval_rows(plan) for e in r["episodes"]]
    assert Counter((e["task_id"], e["init_state_id"]) for e in listed) == {p: trials for p in pairs}
    # in order: task (as listed), init state ascending, trial ascending; numbered 0..E-1
    assert [(e["task_id"], e["init_state_id"], e["trial"]) for e in listed] == \
        [(t, s, k) for t, s in pairs for k in range(trials)]
    assert [e["episode"] for e in listed] == list(range(total))
    # contiguous, sizes differing by at most one, the first E % W one larger
    q, r = divmod(total, workers)
    assert [len(row["episodes"]) for row in eval_rows(plan)] == [q + 1] * r + [q] * (workers - r)
    # seeds: distinct, none a training worker's
    seeds = [e["seed"] for e in listed]
    assert len(set(seeds)) == total and not set(seeds) & {row["seed"] for row in rows(plan)}
    for row in eval_rows(plan):
        envs = row["kwargs"]["schedule"]["envs"]
        assert list(envs) == [json.dumps(t) for t in row["tasks"]]
        assert row["kwargs"]["env"] == envs[json.dumps(row["episodes"][0]["task_id"])]
        for task in row["tasks"]:
            first = next(e for e in row["episodes"] if e["task_id"] == task)
            assert envs[json.dumps(task)].get("init_state_id", 0) == (first["init_state_id"] or 0)
    assert check_plan(plan) == []
    assert dumps(compile_dict(data)) == dumps(plan)  # deterministic, to the byte


# --- the plan file ------------------------------------------------------------------------------------

def test_json_round_trip_through_write_and_load(tmp_path):
    plan = compile_dict(with_eval(libero(1, 2, tasks=[0, 1]), tasks=[8, 9], init_states=[0, 7], workers=3))
    path = tmp_path / "plan.json"
    write(plan, str(path))
    loaded = topo.load(path)
    assert loaded.data == seal(plan) and loaded.data["eval"] == plan["eval"]
    assert "eval" in loaded.data["digest"]["parts"]
    assert read_plan(str(path)) == seal(plan)


def _refused(plan: dict) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        check_plan(plan)
    return [(d.code, d.dotted_path) for d in caught.value.diagnostics]


def test_an_edited_eval_section_is_refused():
    plan = compile_dict(with_eval(toy(1, 2, tasks=[0]), tasks=[1, 2], trials=3, workers=2))
    sealed = json.loads(dumps(plan))
    edited = json.loads(dumps(plan))
    edited["eval"]["every"] = 5
    with pytest.raises(SpecError) as caught:
        check_plan(edited)
    (d,) = caught.value.diagnostics
    assert d.code == "plan-edited" and "the plan was changed after topo wrote it: eval no longer" in d.message
    row = plan["eval"]["subcollectors"][0]["workers"][1]
    row["kwargs"]["seed"] += 100
    row["episodes"] = row["episodes"][1:]
    found = _refused(plan)
    assert ("plan-inconsistent", "eval.subcollectors[0].workers[1].kwargs.seed") in found
    assert ("plan-inconsistent", "eval.subcollectors[0].workers[1].episodes") in found
    sealed["eval"]["subcollectors"][0]["workers"][0]["role"] = "train"
    assert ("plan-schema-const", "eval.subcollectors[0].workers[0].role") in _refused(sealed)


# --- the dry run --------------------------------------------------------------------------------------

def test_dry_run_prints_the_eval_table_and_coverage(tmp_path):
    spec = tmp_path / "toy.yaml"
    spec.write_text(json.dumps(with_eval(toy(2, 3, tasks=[0, 1, 2]), **TOY_EVAL, every=10)))
    result = CliRunner().invoke(main, ["plan", str(spec), "--dry-run"], env={"COLUMNS": "120"}, prog_name="topo")
    assert result.exit_code == 0, result.output
    text = result.stdout
    tail = text[text.index("\neval: "):]
    assert tail == textwrap.dedent("""
        eval: 10 episode(s) per evaluation (2 tasks x 5 trials) over 3 worker(s) in 2 subcollector(s)
          every 10 training iteration(s), blocking (busy: skip)
          episodes: at most 20 steps, exploration deterministic, policy copy, seeds offset from 6

        eval subcollector 0: 2 workers, render gpu -
        w  g  episodes  first..last   seeds  tasks
        0  0         4         0..3    6..9  3
        1  1         3         4..6  10..12  3-4

        eval subcollector 1: 1 workers, render gpu -
        w  g  episodes  first..last   seeds  tasks
        0  2         3         7..9  13..15  4

        eval coverage:
          tasks: 2 (2 held out), episodes per task 5 (even)
            3: 5 episode(s) (5 trials), held out: toy task 3
            4: 5 episode(s) (5 trials), held out: toy task 4
          episodes per worker: 4 for worker 0, 3 for workers 1-2
            (uneven: 10 episodes over 3 workers, 10 % 3 = 1 get one more; each (task, init state) still runs exactly 5 times)
        """)
    assert text.startswith("plan 'topology': 2 subcollector(s), 6 workers, backend toy")
    assert all(len(line) <= 120 for line in text.splitlines())


def test_dry_run_libero_marks_held_out_tasks_and_init_states():
    data = with_eval(libero(1, 2, tasks=[0, 1]), tasks=[1, 9], workers=4, render_gpus=[0])
    from topo.compiler.render import plan_text

    text = plan_text(compile_dict(data), width=200)
    assert "eval: 100 episode(s) per evaluation (2 tasks x 50 init states x 1 trial) over 4 worker(s)" in text
    assert "tasks: 2 (1 held out), episodes per task 50 (even)" in text
    assert f"    1: 50 episode(s) (50 init states x 1 trial): {SPATIAL[1]}" in text
    assert f"    9: 50 episode(s) (50 init states x 1 trial), held out: {SPATIAL[9]}" in text
    assert "episodes per worker: 25 in each of 4" in text and "eval subcollector 0: 4 workers, render gpu 0 (cuda)" in text


# --- bounds (no torch: test_golden.py compiles the eval example in a fresh interpreter) ------------------------------------------------------------------------------

def test_a_huge_evaluation_is_refused_by_arithmetic_at_once():
    start = time.monotonic()
    checked = checked_of(with_eval(toy(1, 2), tasks="0-99999", trials=1_000_000))[1]
    assert [d.code for d in checked.errors] == ["eval-too-large"]
    assert time.monotonic() - start < 5  # 10**11 episodes were counted, not listed
