"""Evaluation's parts without a launch: an eval worker's env (real ToyVLAEnv, in this process), the episodes
a batch ends, the per-task figures and their intervals, the eval collector's plan."""
from __future__ import annotations

import pytest
import torch

from topo.launch.evaluation import results as eval_results
from topo.launch.evaluate import _batch_bound, finished, run_plan
from topo.launch.supervision.teardown import shutdown_budget
from topo.worker import make_env

TOY = {"success_steps": 3, "state_dim": 8, "group_id_offset": 0}


def schedule(tasks=(0, 0, 1), max_steps=5):
    episodes = [{"episode": 10 + i, "task_id": t, "instruction": f"task {t}", "init_state_id": None, "trial": i,
                 "seed": 100 + i} for i, t in enumerate(tasks)]
    envs = {str(t): {**TOY, "instruction": f"task {t}"} for t in dict.fromkeys(tasks)}
    return {"envs": envs, "episodes": episodes, "max_episode_steps": max_steps}


class Rounds:
    def __init__(self):
        self.now = 0

    def __call__(self):
        return self.now


def scheduled(sched, rounds):
    from topo.envs.scheduled import ScheduledEnv
    from topo.runtime.builder import import_builder

    return ScheduledEnv(sched, lambda env: import_builder("topo.envs.toy:build")(dict(env)), rounds)


def test_a_worker_runs_its_episodes_in_order_once_per_round_then_idles():
    rounds = Rounds()
    env = scheduled(schedule(), rounds)
    first = env.rollout(3, break_when_any_done=False)  # before any round: idle, one step each
    assert first["next", "eval_episode"].flatten().tolist() == [-1, -1, -1]
    assert first["next", "done"].all()
    rounds.now = 1
    out = env.rollout(18, break_when_any_done=False)
    episode = out["next", "eval_episode"].flatten().tolist()
    # rollout resets first: episodes 10, 11, 12 of at most 5 steps each, then idle
    assert [e for i, e in enumerate(episode) if i == 0 or e != episode[i - 1]] == [10, 11, 12, -1]
    ends = out["next", "done"].flatten() & (out["next", "eval_episode"].flatten() >= 0)
    assert out["next", "eval_episode"].flatten()[ends].tolist() == [10, 11, 12]
    assert (out["next", "eval_length"].flatten()[ends] <= 5).all()
    assert out["language_instruction"][episode.index(12)] == "task 1" and env.rebuilds == 1
    rounds.now = 2  # a new round runs the list again, from its first episode (task 0 again: one more rebuild)
    again = env.rollout(18, break_when_any_done=False)
    ends2 = again["next", "done"].flatten() & (again["next", "eval_episode"].flatten() >= 0)
    assert again["next", "eval_episode"].flatten()[ends2].tolist() == [10, 11, 12]
    assert (again["next", "eval_round"].flatten()[ends2] == 2).all() and env.rebuilds == 3


def test_between_rounds_every_reset_is_idle_for_a_worker_built_then_too():
    """Round 1 ended (-1): a worker built then, as one restarted between rounds is, runs nothing until round 2, and
    then runs its episodes of round 2 only (not round 1's again, which would spend round 2's batches)."""
    rounds = Rounds()
    rounds.now = -1
    env = scheduled(schedule(), rounds)
    idle = env.rollout(4, break_when_any_done=False)
    assert idle["next", "eval_episode"].flatten().tolist() == [-1] * 4
    rounds.now = 2
    out = env.rollout(18, break_when_any_done=False)
    ends = out["next", "done"].flatten() & (out["next", "eval_episode"].flatten() >= 0)
    assert out["next", "eval_episode"].flatten()[ends].tolist() == [10, 11, 12]
    assert (out["next", "eval_round"].flatten()[ends] == 2).all()
    rounds.now = -2  # ended while this worker idles after its episodes: still idle
    assert env.rollout(3, break_when_any_done=False)["next", "eval_episode"].flatten().tolist() == [-1] * 3


def test_an_episode_starts_from_its_seed_whatever_ran_before():
    rounds = Rounds()
    rounds.now = 1
    a = scheduled(schedule(tasks=(0, 0, 0)), rounds)
    starts = [a.reset() for _ in range(3)]  # episodes 10, 11, 12: one reset each
    assert [s["eval_episode"].item() for s in starts] == [10, 11, 12]
    state = [s["observation", "state"] for s in starts]
    assert not torch.equal(state[0], state[1])  # other seeds, other starts
    a.rollout(4, break_when_any_done=False)
    rounds.now = 2
    again = a.reset()
    fresh = scheduled(schedule(tasks=(0, 0, 0)), rounds).reset()
    assert again["eval_episode"].item() == fresh["eval_episode"].item() == 10
    assert again["eval_checksum"].item() == fresh["eval_checksum"].item() == starts[0]["eval_checksum"].item() != 0
    assert torch.equal(again["observation", "state"], state[0]) and torch.equal(fresh["observation", "state"], state[0])


def test_make_env_builds_a_scheduled_env_from_an_eval_row_and_seeds_it():
    sched = schedule()
    env = make_env(builder="topo.envs.toy:build", env=sched["envs"]["0"], seed=100, schedule=sched)
    assert type(env).__name__ == "ScheduledEnv" and env.round == 0
    from torchrl.envs.utils import check_env_specs

    check_env_specs(env)  # round 1 outside a run: the specs hold for episodes and idle steps alike


def batch_of(rows):
    """A [1, T] batch with the eval fields of ``rows`` (done, round, episode, success, length, return, version,
    init state applied, checksum)."""
    from tensordict import TensorDict

    t = len(rows)
    col = lambda i, dtype: torch.tensor([[r[i]] for r in rows], dtype=dtype).reshape(1, t, 1)  # noqa: E731
    return TensorDict({
        "policy_version": torch.tensor([r[6] for r in rows]).reshape(1, t),
        "next": {"done": col(0, torch.bool), "eval_round": col(1, torch.int64), "eval_episode": col(2, torch.int64),
                 "eval_init_state": col(7, torch.int64), "eval_checksum": col(8, torch.float64),
                 "eval_success": col(3, torch.bool), "eval_length": col(4, torch.int64),
                 "eval_return": col(5, torch.float32)}}, batch_size=[1, t])


def test_finished_reads_each_episode_of_this_round_at_its_last_step():
    batch = batch_of([
        (False, 2, 4, False, 1, 0.0, 2, 7, 1.5),
        (True, 2, 4, True, 2, 1.0, 2, 7, 3.25),   # episode 4 ends: success, 2 steps, from init state 7
        (True, 2, -1, False, 0, 0.0, 2, 7, 0.0),  # idle
        (True, 1, 5, True, 3, 1.0, 1, -1, 9.0),   # a stale round's episode
        (True, 2, 5, False, 3, 0.5, 2, -1, 4.0),  # an env with no init state to say
    ])
    assert finished(batch, 2) == [
        {"episode": 4, "init_state_applied": 7, "success": True, "length": 2, "return": 1.0, "checksum": 3.25,
         "acting_version": 2, "episode_id": None},
        {"episode": 5, "init_state_applied": None, "success": False, "length": 3, "return": 0.5, "checksum": 4.0,
         "acting_version": 2, "episode_id": None}]


@pytest.mark.parametrize("k, n, lo, hi", [(0, 10, 0.0, 0.2775), (10, 10, 0.7225, 1.0), (5, 10, 0.2366, 0.7634),
                                          (1, 1, 0.2065, 1.0)])
def test_wilson_intervals(k, n, lo, hi):
    assert eval_results.wilson(k, n) == [lo, hi]


def test_summarise_per_task_held_out_and_other_weights():
    section = {"held_out": [3]}
    plan_eps = {e: (0, e // 2, {"episode": e, "task_id": 2 if e < 2 else 3, "instruction": f"t{2 if e < 2 else 3}",
                                "init_state_id": e % 2, "trial": 0, "seed": 50 + e}) for e in range(4)}
    ended = {0: {"init_state_applied": 0, "success": True, "length": 4, "return": 1.0, "acting_version": 1},
             1: {"init_state_applied": 0, "success": False, "length": 8, "return": 0.0, "acting_version": 1},
             2: {"init_state_applied": 0, "success": True, "length": 6, "return": 1.0, "acting_version": 0},
             3: {"init_state_applied": 1, "success": True, "length": 2, "return": 1.0, "acting_version": 1}}
    r = eval_results.summarise(section, plan_eps, ended, round_=1, step=7, version=3, acting_version=1, seconds=2.0)
    assert (r["episodes"], r["successes"], r["success_rate"], r["mean_length"]) == (4, 3, 0.75, 5.0)
    assert [(t["task_id"], t["held_out"], t["episodes"], t["successes"], t["mean_length"]) for t in r["tasks"]] == [
        (2, False, 2, 1, 6.0), (3, True, 2, 2, 4.0)]
    assert r["other_weights"] == [2] and r["other_init_states"] == [1]  # episode 1 planned init state 1, ran 0
    assert r["episodes_detail"][3] == {"episode": 3, "task_id": 3, "init_state_id": 1, "trial": 0, "seed": 53,
                                       "subcollector": 0, "worker": 1, "ended": True, "init_state_applied": 1,
                                       "success": True, "length": 2,
                                       "return": 1.0, "checksum": None, "acting_version": 1,
                                       "episode_id": None}
    text = eval_results.table(r)
    assert text.splitlines()[0] == ("evaluation 1 (step 7): 3/4 episodes succeeded, 75.0% [95% CI 30.1-95.4], "
                                    "policy version 3, 2.0s")
    assert "    3  yes              2        2  100.0%   34.2-100.0     4.0  t3" in text
    assert "episodes 2 acted with other weights" in text and "episodes 1 started from other init states" in text


def test_results_files_and_the_plot_after_two_rounds(tmp_path):
    section = {"held_out": []}
    planned = {0: (0, 0, {"episode": 0, "task_id": 1, "instruction": "x", "init_state_id": None, "trial": 0, "seed": 1})}
    rounds = []
    for n, ok in ((1, False), (2, True)):
        rounds.append(eval_results.summarise(section, planned, {0: {"success": ok, "length": 3, "return": 0.0,
                                                                     "acting_version": n}},
                                             round_=n, step=10 * n, version=n, acting_version=n, seconds=1.0))
        eval_results.write(str(tmp_path), rounds[-1], rounds)
    import json

    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert [r["success_rate"] for r in results["rounds"]] == [0.0, 1.0]
    assert "episodes_detail" not in results["rounds"][0]
    assert json.loads((tmp_path / "eval" / "round-002.json").read_text())["episodes_detail"][0]["success"] is True
    assert (tmp_path / "eval" / "success.png").stat().st_size > 0


def eval_plan():
    row = lambda g, eps: {"subcollector": 0, "index": g, "global_index": g, "role": "eval",  # noqa: E731
                          "episodes": eps, "kwargs": {"seed": eps[0]["seed"], "schedule": {}}}
    eps = [{"episode": e, "seed": 9 + e} for e in range(5)]
    return {"name": "p", "launch": {"shutdown_timeout": None}, "policy": {"factory": "m:f", "placement": "server"},
            "subcollectors": [{"index": 0, "num_workers": 3, "workers": []}], "coverage": {},
            "eval": {"max_episode_steps": 10, "subcollectors": [{"index": 0, "num_workers": 2,
                                                                 "workers": [row(0, eps[:3]), row(1, eps[3:])]}]}}


def test_the_eval_collector_plan_and_budgets():
    plan = eval_plan()
    out = run_plan(plan)
    assert "eval" not in out and "coverage" not in out and out["name"] == "p [eval]"
    assert out["collector"] == {"sync": True, "frames_per_batch": 16, "total_frames": -1}
    assert [r["seed"] for r in out["subcollectors"][0]["workers"]] == [9, 12]
    assert out["policy"]["placement"] == "subcollector"  # eval.policy copy (the default): a copy per eval subcollector
    plan["eval"]["policy"] = "server"
    assert run_plan(plan)["policy"]["placement"] == "server"
    assert _batch_bound(plan["eval"]) == 2 + 3 * 11 // 8
    # training 10 + 5 x 3, and the eval run's 10 + 5 x 2 with its teardown stages (18 s)
    assert shutdown_budget(plan, evaluation=False) == 25.0 and shutdown_budget(plan) == 25.0 + 20.0 + 18.0


def test_a_protocol_round_is_shaped_as_lerobot_eval_shapes_its_results_and_says_it_is_narrowed():
    from topo.compiler.protocols import LIBERO

    protocol = {"name": "libero", "suites": ["libero_goal", "libero_10"], "narrowed": {"tasks": 0},
                "horizons": {"libero_goal": 300, "libero_10": 520}, "env_kwargs": {"settle_steps": 10}, "seed": 7,
                "source": LIBERO.source}
    planned = {e: (0, 0, {"episode": e, "task_id": ["libero_goal:0", "libero_10:0"][e // 2], "instruction": "x",
                          "init_state_id": e % 2, "trial": 0, "seed": 7}) for e in range(4)}
    ended = {e: {"init_state_applied": e % 2, "success": e != 3, "length": 5, "return": 1.0, "acting_version": 0}
             for e in range(4)}
    r = eval_results.summarise({"held_out": [], "protocol": protocol}, planned, ended, round_=1, step=None,
                               version=None, acting_version=0, seconds=3.0)
    assert [(t["task_group"], t["task_id"], t["metrics"]["n_episodes"], t["metrics"]["pc_success"])
            for t in r["per_task"]] == [("libero_goal", 0, 2, 100.0), ("libero_10", 0, 2, 50.0)]
    assert {g: (m["n_episodes"], m["successes"], m["pc_success"]) for g, m in r["per_group"].items()} == {
        "libero_goal": (2, 2, 100.0), "libero_10": (2, 1, 50.0)}
    assert (r["overall"]["n_episodes"], r["overall"]["pc_success"], r["overall"]["eval_s"]) == (4, 75.0, 3.0)
    assert r["overall"]["ci95_pc"] == [round(100 * x, 2) for x in eval_results.wilson(3, 4)]
    assert "protocol libero, NARROWED (tasks 0): not comparable" in eval_results.table(r).splitlines()[1]


def test_a_variant_is_paired_with_its_base_suite_episode_by_episode():
    planned = {e: (0, 0, {"episode": e, "task_id": ["libero_goal:0", "libero_goal_swap:0"][e // 4], "instruction": "x",
                          "init_state_id": e % 4, "trial": 0, "seed": e % 4}) for e in range(8)}
    wins = {0: True, 1: True, 2: True, 3: False, 4: True, 5: False, 6: False, 7: False}
    ended = {e: {"init_state_applied": e % 4, "success": wins[e], "length": 5, "return": 1.0, "acting_version": 0}
             for e in range(8)}
    r = eval_results.summarise({"held_out": [], "variants": {"libero_goal_swap": "libero_goal"}}, planned, ended,
                               round_=1, step=None, version=None, acting_version=0, seconds=1.0)
    (row,) = r["robustness"]
    assert (row["suite"], row["variant"], row["pairs"], row["suite_rate"], row["variant_rate"], row["drop"]) == (
        "libero_goal", "libero_goal_swap", 4, 0.75, 0.25, 0.5)
    assert row["discordant"] == {"suite_only": 2, "variant_only": 0} and row["mcnemar_p"] == 0.5
    assert "robustness libero_goal_swap: 25.0% against libero_goal's 75.0% on 4 paired episodes: a drop of 50.0%" \
        in eval_results.table(r)
