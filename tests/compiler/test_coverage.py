"""topo.compiler.coverage on hand-made plans: what a valid spec never produces (incomplete groups) is still caught."""
from __future__ import annotations

from topo.compiler.coverage import coverage
from topo.compiler.render import coverage_text


def row(c, w, g, group, task=0, init=("cycle", 0), gpu=None, instruction="i"):
    return {"subcollector": c, "index": w, "global_index": g, "task_id": task, "instruction": instruction,
            "group": group, "group_id_offset": group * 10**6, "init_state_mode": init[0], "init_state_id": init[1],
            "render_gpu": gpu}


def plan_of(subs, groups):
    return {"groups": groups, "subcollectors": [{"index": c, "workers": rows} for c, rows in enumerate(subs)]}


def test_incomplete_groups_are_named():
    sub0 = [
        row(0, 0, 0, 0), row(0, 1, 1, 0),                  # group 0: complete
        row(0, 2, 2, 1),                                   # group 1: split over subcollectors 0 and 1
        row(0, 3, 3, 2, task=0), row(0, 4, 4, 2, task=1),  # group 2: two tasks
        row(0, 5, 5, 3, init=("cycle", 0)), row(0, 6, 6, 3, init=("cycle", 1)),  # group 3: two init states
    ]
    sub1 = [
        row(1, 0, 7, 1),
        row(1, 1, 8, 4),                                   # group 4: one worker short
        row(1, 2, 9, 5), row(1, 3, 10, 5), row(1, 4, 11, 5),  # group 5: one worker too many
    ]
    cov = coverage(plan_of([sub0, sub1], {"size": 2, "parallel_repeats": True}))
    assert cov["groups"] == {"count": 6, "workers_per_group": 2, "complete": 1, "incomplete": [1, 2, 3, 4, 5]}
    assert "groups: 6 of 2 worker(s) each, 5 INCOMPLETE: [1, 2, 3, 4, 5]" in coverage_text({"coverage": cov})


def test_without_parallel_repeats_every_worker_is_its_own_group():
    sub = [row(0, w, w, w, task=w % 2) for w in range(4)]
    cov = coverage(plan_of([sub], {"size": 4, "parallel_repeats": False}))
    assert cov["groups"] == {"count": 4, "workers_per_group": 1, "complete": 4, "incomplete": []}
    cov = coverage(plan_of([sub], None))
    assert cov["groups"]["workers_per_group"] == 1 and cov["groups"]["incomplete"] == []


def test_counts():
    sub0 = [row(0, 0, 0, 0, task=3, gpu=1, instruction="a"), row(0, 1, 1, 1, task=3, gpu=1, instruction="a"),
            row(0, 2, 2, 2, task=None, gpu=1, instruction=None)]
    sub1 = [row(1, 0, 3, 3, task=0, gpu=None, instruction="b"), row(1, 1, 4, 4, task=3, gpu=None, instruction="c")]
    cov = coverage(plan_of([sub0, sub1], None))
    assert cov["workers"] == 5 and cov["subcollectors"] == 2
    assert cov["tasks"] == [{"task_id": 0, "workers": 1, "groups": 1}, {"task_id": 3, "workers": 3, "groups": 3},
                            {"task_id": None, "workers": 1, "groups": 1}]
    assert cov["instructions_per_subcollector"] == [2, 2]
    assert cov["render_gpus"] == [{"render_gpu": 1, "workers": 3}, {"render_gpu": None, "workers": 2}]
