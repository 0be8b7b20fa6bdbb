"""``env.transforms`` launched (toy 1 x 2, TinyVLA acting in chunks of 8): the stack built only where envs are
(in each worker, or over the subcollector's ParallelEnv), decisions and env steps counted where they ran and
recorded per episode, chunked episodes replayed bit for bit, a transform that raises named with its row."""
from __future__ import annotations

import glob
import json
import time

import pytest

from tests.launch.launch_helpers import assert_clean_launch, launch, run_dir, summary, toy_spec, user_spec, write
from tests.launch.test_launch_faults import assert_no_bare_traceback, assert_torn_down
from topo.runs.replay import replay
from topo.runtime.episodes import Episodes

CHUNK = 8
POLICY = {"factory": "topo.policies.tinyvla:make",
          "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8, "chunk_size": CHUNK}}
STACK = [{"MultiAction": {"stack_rewards": False}}, {"StepCounter": {"max_steps": 3}}]


def chunked_spec(mode: str = "multi", at: str = "worker", success_steps: int = 2, max_steps: int = 3) -> dict:
    """Toy 1 x 2; with ``success_steps`` 2 episodes end mid-chunk (2 steps in tolerance), never past a chunk."""
    kwargs = {"success_steps": success_steps, "success_tol": 0.5, "state_dim": 8}
    stack = [STACK[0], {"StepCounter": {"max_steps": max_steps}}]
    return toy_spec(1, 2, env={"backend": "toy", "kwargs": kwargs, "transforms": stack, "transforms_at": at},
                    collector={"frames_per_batch": 16, "mode": mode}, policy=POLICY,
                    launch={**toy_spec()["launch"], "record_actions": True})


def episode_ends(report) -> list[dict]:
    return [r for f in glob.glob(str(run_dir(report) / "episodes" / "w*.jsonl"))
            for r in map(json.loads, open(f)) if r["event"] == "end"]


def plan_of(report) -> dict:
    return summary(report)["plan"]


@pytest.mark.parametrize("mode", ["multi", "async"])
def test_chunks_in_each_worker_count_decisions_and_env_steps_and_replay(tmp_path, mode):
    """Long: a real launch (toy 1 x 2, TinyVLA deciding chunks of 8) and a replay of its episodes, per mode."""
    spec, report = write(tmp_path / "chunked.yaml", chunked_spec(mode)), tmp_path / "report"
    result = launch(spec, "--batches", 3, "--report", report)
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    if mode == "multi":
        s = assert_clean_launch(report, plan_of(report), t_end)
    else:
        s = assert_torn_down(report, t_end)
        assert s["ok"] and s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    steps, ends = s["steps"], episode_ends(report)
    assert steps["transforms"] == ["MultiAction", "StepCounter"] and steps["transforms_at"] == "worker"
    assert steps["transforms_built"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    if mode == "multi":
        assert steps["decisions"] == 3 * 16  # a batch holds decisions
    assert steps["decisions"] == sum(e["steps"] for e in ends)  # every step in an episode, each closed
    assert steps["env_steps"] == sum(e["env_steps"] for e in ends)
    assert steps["decisions"] < steps["env_steps"] < CHUNK * steps["decisions"]  # some succeeded mid-chunk
    assert any(e["env_steps"] < CHUNK * e["steps"] for e in ends if e["how"] == "terminated")
    assert f"  steps: {steps['decisions']} decisions, {steps['env_steps']} env steps; transforms MultiAction, " \
           "StepCounter at worker (built: trainer 0, server 0, subcollector 0, worker 2)" in result.stdout
    mid = next(e for e in ends if e["how"] == "terminated" and e["env_steps"] < CHUNK * e["steps"])
    shown = Episodes(run_dir(report)).get(mid["id"]).summary()  # what topo runs show lists
    assert (shown["steps"], shown["env_steps"]) == (mid["steps"], mid["env_steps"])
    done = replay(str(run_dir(report)), mid["id"])
    assert done.identical and done.steps == mid["steps"], str(done)


def test_chunks_over_the_subcollectors_parallel_env(tmp_path):
    """The recipe's placement: the stack is built in the subcollector (0 in the trainer, 0 in workers); no episode
    ends mid-chunk here (StepCounter truncates between decisions), so env steps are exactly 8 per decision."""
    spec, report = write(tmp_path / "sub.yaml", chunked_spec(at="subcollector", success_steps=25)), tmp_path / "report"
    result = launch(spec, "--batches", 3, "--report", report)
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    s = assert_clean_launch(report, plan_of(report), t_end)
    assert s["steps"]["transforms_built"] == {"trainer": 0, "server": 0, "subcollector": 1, "worker": 0}
    assert s["steps"]["decisions"] == 3 * 16 and s["steps"]["env_steps"] == CHUNK * 3 * 16
    assert all("transforms" not in row["kwargs"] for row in plan_of(report)["subcollectors"][0]["workers"])
    ends = episode_ends(report)  # the workers see env steps only: their records are steps of one action
    assert sum(e["steps"] for e in ends) == CHUNK * 3 * 16 and all("env_steps" not in e for e in ends)
    first = min(e["id"] for e in ends)
    done = replay(str(run_dir(report)), first)  # the worker's env, step by env step: no stack to rebuild
    assert done.identical and done.steps == next(e["steps"] for e in ends if e["id"] == first), str(done)


def test_a_transform_that_raises_in_the_worker_is_named_with_its_row(tmp_path):
    spec = write(tmp_path / "raise.yaml", chunked_spec(max_steps=0))  # valid kwargs; StepCounter refuses 0
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet")
    t_end = time.time()
    assert result.returncode == 1, result.stderr
    err = result.stderr
    assert "env worker failed during construction: topo.runtime.transforms.TransformError: env.transforms[1] " \
           "StepCounter: ValueError: max_steps should have a value greater or equal to one." in err
    assert "at subcollector 0, worker " in err and "plan row: global_index=" in err and "seed=10" in err
    assert_no_bare_traceback(err)
    s = assert_torn_down(report, t_end)
    assert s["exit_code"] == 1 and s["error"]["subcollector"] == 0 and s["steps"]["transforms_built"]["trainer"] == 0


def test_a_worker_killed_mid_chunk_restarts_under_its_stack(tmp_path):
    """Worker 1 SIGKILLs itself in its 21st env step, the 5th action of its 3rd chunk; its subcollector starts again
    from its rows, which carry the stack: the run collects every batch, each new worker built its stack."""
    spec = user_spec("faulty:dying_step", 1, 2, fault_seed=1, after_steps=20)
    spec["env"]["transforms"] = STACK
    spec["assignment"].update(tasks=[0, 1], groups={"size": 1, "candidate_size": 2})
    spec["launch"]["restarts"] = {"max": 1}
    spec["policy"] = {**POLICY, "kwargs": {**POLICY["kwargs"], "state_dim": 6}}
    spec["collector"] = {"frames_per_batch": 4}
    report = tmp_path / "report"
    result = launch(write(tmp_path / "spec.yaml", spec), "--batches", 8, "--report", report)
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    s = assert_torn_down(report, t_end)
    (restart,) = s["restarts"]
    assert (restart["cause"]["kind"], restart["cause"]["worker"], restart["outcome"]) == ("worker-died", 1, "collecting")
    assert s["launch"]["batches_collected"] == 8
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert s["steps"]["transforms_built"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    # every decision that returned took 8 env steps; the one the worker died in, 4 before the 5th killed it
    assert s["steps"]["env_steps"] == CHUNK * s["steps"]["decisions"] + 4
