"""The launch pieces without a topology: first-batch checks, shutdown budget, start slots, the worker
factory's markers, and a torch-free command import."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from topo.launch import observe
from topo.launch.markers import RUN_DIR_VAR, SLOTS_VAR, RunDir
from topo.launch.plans import SHUTDOWN_BASE_S, SHUTDOWN_PER_WORKER_S, shutdown_budget


def plan_of(*subs: list[tuple[str, int]]) -> dict:
    """A plan skeleton: per subcollector, per worker (instruction, group)."""
    return {
        "launch": {"shutdown_timeout": None},
        "subcollectors": [
            {"index": c, "num_workers": len(rows),
             "workers": [{"index": w, "instruction": i, "group": g} for w, (i, g) in enumerate(rows)]}
            for c, rows in enumerate(subs)
        ],
    }


PLAN = plan_of([("a", 0), ("b", 1)], [("a", 2), ("b", 3)])


def seen(*workers: tuple[str, int]) -> list[dict]:
    return [{"instructions": [i], "groups": [g]} for i, g in workers]


def test_sync_batch_matching_the_plan():
    batches = [{"subcollector": 0, "workers": seen(("a", 0), ("b", 1))},
               {"subcollector": 1, "workers": seen(("a", 2), ("b", 3))}]
    result = observe.check(PLAN, batches)
    assert [r["status"] for r in result] == ["ok", "ok"]
    assert result[1]["groups"] == [2, 3] and result[1]["instructions"] == ["a", "b"]


def test_sync_batch_with_a_swapped_instruction_is_a_mismatch():
    batches = [{"subcollector": 0, "workers": seen(("b", 0), ("b", 1))}]
    result = observe.check(PLAN, batches)
    assert result[0]["status"] == "mismatch"
    assert result[0]["mismatches"] == [{"worker": 0, "field": "instructions", "planned": ["a"], "observed": ["b"]}]
    assert result[1]["status"] == "not observed"


def test_async_batches_are_attributed_by_content():
    batches = [{"subcollector": None, "workers": seen(("a", 2), ("b", 3))},
               {"subcollector": None, "workers": seen(("a", 2), ("b", 3))},  # the same subcollector again
               {"subcollector": None, "workers": seen(("a", 9), ("b", 9))}]
    result = observe.check(PLAN, batches)
    assert [r["status"] for r in result] == ["not observed", "ok", "unmatched"]
    assert result[2]["batches"] == [seen(("a", 9), ("b", 9))]


def test_nothing_observable_and_env_chosen_instructions():
    assert [r["status"] for r in observe.check(PLAN, [{"subcollector": None, "workers": [{}, {}]}])] == [
        "nothing observable", "nothing observable"]
    free = plan_of([(None, 0)])
    assert observe.check(free, [{"subcollector": 0, "workers": seen(("own", 0))}])[0]["status"] == "ok"


def test_shutdown_budget_is_sized_to_the_largest_subcollector():
    plan = plan_of([("a", 0)] * 3, [("a", 0)] * 5)
    assert shutdown_budget(plan) == SHUTDOWN_BASE_S + 5 * SHUTDOWN_PER_WORKER_S
    plan["launch"]["shutdown_timeout"] = 42
    assert shutdown_budget(plan) == 42.0


def test_start_slots_bound_concurrent_constructions(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOTS_VAR, "2")
    run = RunDir(str(tmp_path))
    inside, peak, lock = [0], [0], threading.Lock()

    def build():
        with run.start_slot():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.2)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=build) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2


def test_make_env_writes_markers_and_records_close(tmp_path, monkeypatch):
    from topo.worker import make_env

    monkeypatch.setenv(RUN_DIR_VAR, str(tmp_path))
    worker = {"subcollector": 1, "index": 2, "global_index": 5}
    env = make_env(builder="topo.envs.toy:build", env={"instruction": "lift"}, seed=7, render_gpu=None, worker=worker)
    assert env.reset()["language_instruction"] == "lift"
    env.close()
    env.close(raise_if_closed=False)  # a second close writes no second marker
    names = [m["name"] for m in RunDir(str(tmp_path)).read_new("markers")]
    assert names == ["started", "constructed", "closed"]
    with pytest.raises(TypeError):
        make_env(builder="topo.envs.toy:build", env={"no_such_kwarg": 1}, worker=worker)
    (failed,) = [m for m in RunDir(str(tmp_path)).read_new("markers") if m["name"] == "failed"]
    assert failed["worker"] == worker and "no_such_kwarg" in failed["traceback"]


def test_make_env_applies_the_seed_without_a_run_directory(monkeypatch):
    from topo.worker import make_env

    monkeypatch.delenv(RUN_DIR_VAR, raising=False)
    images = [make_env(builder="topo.envs.toy:build", env={}, seed=seed).reset()["observation", "image"]
              for seed in (3, 3, 4)]
    assert (images[0] == images[1]).all() and not (images[0] == images[2]).all()


def test_importing_the_command_imports_no_torch():
    code = "import sys, topo.launch.command; sys.exit('torch' in sys.modules or 'torchrl' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_make_env_gives_the_worker_the_users_gl_back(tmp_path, monkeypatch):
    from topo import gl
    from topo.worker import make_env

    monkeypatch.setenv(RUN_DIR_VAR, str(tmp_path))
    monkeypatch.setenv("MUJOCO_GL", "disable")  # as the collector process held it
    monkeypatch.setenv(gl.HELD_VAR, "egl")
    before = gl.loaded_libraries()
    make_env(builder="topo.envs.toy:build", env={}, worker={"subcollector": 0, "index": 0}).close()
    assert os.environ["MUJOCO_GL"] == "egl" and gl.HELD_VAR not in os.environ
    (started,) = [m for m in RunDir(str(tmp_path)).read_new("markers") if m["name"] == "started"]
    assert started["inherited_gl"] == before  # what this process had mapped before the builder ran
