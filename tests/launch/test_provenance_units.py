"""Episode provenance without a launch: ids, the records a worker writes (real ToyVLAEnv in this process),
their reading and filtering, the replay of a later episode from its seed state, and `topo runs show`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from torchrl.envs.utils import step_mdp

from topo.cli import main
from topo.envs.recording import wrap
from topo.envs.scheduled import ScheduledEnv
from topo.envs.toy import build
from topo.runtime.episodes import EVAL_BIT, EpisodeId, Episodes, episode_id, find_run
from topo.runs.replay import replay

TOY = {"action_dim": 4, "state_dim": 8, "success_steps": 4, "group_id_offset": 0, "instruction": "push left",
       "group_repeats": 2}


def test_an_id_is_one_int64_with_a_text_that_round_trips():
    e = EpisodeId(row=5, restart=2, episode=12)
    assert str(e) == "w5-r2-e12" and EpisodeId.of(int(e)) == e == EpisodeId.of("w5-r2-e12") == EpisodeId.of(str(int(e)))
    v = EpisodeId(row=1048575, restart=16383, episode=268435455, eval=True)
    assert 0 < int(v) < 2**63 and int(v) & EVAL_BIT and EpisodeId.of(int(v)) == v and str(v).startswith("eval-w1048575")
    assert episode_id(int(e)) == "w5-r2-e12"
    with pytest.raises(ValueError, match="restart must lie in"):
        EpisodeId(row=0, restart=16384, episode=0)
    with pytest.raises(ValueError, match="idle step"):
        EpisodeId.of(-1)
    with pytest.raises(ValueError, match="read like w5-r0-e12"):
        EpisodeId.of("w5.r0.e12")


def _run_dir(tmp_path, plan=None) -> str:
    (tmp_path / "launch.json").write_text(json.dumps({"plan": plan}))
    return str(tmp_path)


def _play(env, steps: int, resets_every: int) -> list[int]:
    """Random actions from a seeded generator; a reset every ``resets_every`` steps: the ids seen."""
    gen = torch.Generator().manual_seed(0)
    td, ids = env.reset(), []
    for t in range(steps):
        ids.append(int(td["topo_episode"]))
        td["action"] = torch.rand(4, generator=gen) * 2 - 1
        td = step_mdp(env.step(td))
        if (t + 1) % resets_every == 0:
            td = env.reset()
    env.close()
    return ids


SPEC = """
version: 1
name: toy
env: {backend: toy, kwargs: {success_steps: 4, state_dim: 8}}
topology: {subcollectors: 1, workers_per_subcollector: 2}
assignment: {tasks: 0-1, groups: {size: 1, candidate_size: 2}, seeds: {base: 100}}
"""


@pytest.fixture(scope="module")
def toy_plan(tmp_path_factory) -> dict:
    import topo

    path = tmp_path_factory.mktemp("spec") / "toy.yaml"
    path.write_text(SPEC)
    return topo.load(str(path)).to_dict()


def test_a_worker_records_each_episode_and_a_later_one_replays_from_its_seed_state(tmp_path, toy_plan):
    plan = toy_plan
    row = plan["subcollectors"][0]["workers"][1]
    run_dir = _run_dir(tmp_path, plan)
    env = build(dict(row["kwargs"]["env"]))
    env.set_seed(row["seed"])
    ids = _play(wrap(env, run_dir, row["kwargs"]["worker"], row["seed"], 0, True), steps=9, resets_every=3)
    assert [str(EpisodeId.of(i)) for i in ids] == [f"w1-r0-e{n}" for n in (0, 0, 0, 1, 1, 1, 2, 2, 2)]
    episodes = Episodes(run_dir)
    assert [str(e.id) for e in episodes] == ["w1-r0-e0", "w1-r0-e1", "w1-r0-e2", "w1-r0-e3"]  # e3: the last reset
    second = episodes.get("w1-r0-e1")
    s = second.summary()
    assert (s["subcollector"], s["worker"], s["task_id"], s["seed"], s["steps"], s["ended"]) == (0, 1, 1, 101, 3, "reset")
    assert s["instruction"] == row["instruction"] and s["group_id"] == row["group_id_offset"]  # group_repeats 2: ep 1
    assert episodes.get("w1-r0-e3").summary()["ended"] == "closed" and episodes.get("w1-r0-e3").end["steps"] == 0
    for name in ("w1-r0-e1", "w1-r0-e2"):
        again = replay(run_dir, name)
        assert again.identical and again.steps == 3 and again.replayed_return == episodes.get(name).end["return"]
    # the global RNG and the env's generator drawn after the recording: the replay restores them
    torch.rand(100)
    assert replay(run_dir, "w1-r0-e2").identical


def test_an_episode_its_worker_never_ended_replays_up_to_its_last_written_chunk(tmp_path, toy_plan):
    """A worker killed mid-episode (no end record, no close): the chunks of steps written before the kill
    (every 16 steps or 1 s) are the recording, and they replay."""
    plan = toy_plan
    row = plan["subcollectors"][0]["workers"][0]
    run_dir = _run_dir(tmp_path, plan)
    env = build(dict(row["kwargs"]["env"]))
    env.set_seed(row["seed"])
    env = wrap(env, run_dir, row["kwargs"]["worker"], row["seed"], 0, True)
    gen = torch.Generator().manual_seed(0)
    td = env.reset()
    for _ in range(100):  # no reset, no close: as if SIGKILLed at step 100
        td["action"] = torch.rand(4, generator=gen)
        td = step_mdp(env.step(td))
    e = Episodes(run_dir).get("w0-r0-e0")
    recorded = len(Episodes(run_dir).steps("w0-r0-e0")["rewards"])  # 96: chunks of 16 steps (or 1 s)
    assert e.end is None and e.chunks and 0 < recorded < 100
    again = replay(run_dir, "w0-r0-e0")
    assert again.identical and again.steps == recorded and not again.complete
    assert "the recording stops there" in str(again)


def test_records_cut_short_by_a_kill_are_read_up_to_the_cut(tmp_path, toy_plan):
    run_dir = _run_dir(tmp_path, toy_plan)
    env = build(dict(TOY))
    _play(wrap(env, run_dir, {"subcollector": 0, "index": 0, "global_index": 0}, 1, 0, False), steps=4, resets_every=2)
    life = tmp_path / "episodes" / "w0.r0.jsonl"
    text = life.read_text()
    life.write_text(text[:-10])  # the last line half written
    assert [str(e.id) for e in Episodes(run_dir)] == ["w0-r0-e0", "w0-r0-e1", "w0-r0-e2"]


def test_an_eval_worker_stamps_its_episodes_and_none_on_idle_steps(tmp_path):
    schedule = {"episodes": [{"episode": 0, "task_id": 0, "init_state_id": None, "seed": 7},
                             {"episode": 1, "task_id": 0, "init_state_id": None, "seed": 8}],
                "envs": {"0": dict(TOY, group_repeats=None)}, "max_episode_steps": 2}
    env = ScheduledEnv(schedule, lambda kw: build(dict(kw)), lambda: 1)
    ids = _play(wrap(env, _run_dir(tmp_path), {"subcollector": 0, "index": 0, "global_index": 3, "role": "eval"},
                     None, 0, False), steps=6, resets_every=2)
    assert [str(EpisodeId.of(i)) if i >= 0 else i for i in ids] == [
        "eval-w3-r0-e0", "eval-w3-r0-e0", "eval-w3-r0-e1", "eval-w3-r0-e1", -1, -1]
    recorded = Episodes(str(tmp_path))
    assert [(str(e.id), e.start["eval_episode"], e.start["eval_round"]) for e in recorded] == [
        ("eval-w3-r0-e0", 0, 1), ("eval-w3-r0-e1", 1, 1)]


def _runs(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(map(str, args)))
    return result.exit_code, result.output


def test_runs_show_lists_filters_and_details_episodes(tmp_path, toy_plan):
    plan = toy_plan
    (tmp_path / "topo-run-x").mkdir()
    run_dir = _run_dir(tmp_path / "topo-run-x", plan)
    for row in plan["subcollectors"][0]["workers"]:
        env = build(dict(row["kwargs"]["env"]))
        env.set_seed(row["seed"])
        _play(wrap(env, run_dir, row["kwargs"]["worker"], row["seed"], 0, False), steps=4, resets_every=2)
    assert find_run(str(tmp_path)) == run_dir  # a report directory: its run
    code, out = _runs("runs", "show", tmp_path)
    assert code == 0 and out.splitlines()[0].endswith("6 episodes recorded, 6 match")
    assert out.splitlines()[1].split() == ["episode", "sub", "worker", "task", "init", "group_id", "seed", "steps",
                                           "return", "success", "ended", "versions"]
    code, out = _runs("runs", "show", tmp_path, "--task", 1, "--format", "json")
    assert code == 0 and [e["id"] for e in json.loads(out)] == ["w1-r0-e0", "w1-r0-e1", "w1-r0-e2"]
    code, out = _runs("runs", "show", run_dir, "w0-r0-e1")
    detail = json.loads(out)
    assert code == 0 and detail["row"]["seed"] == 100 and detail["end"]["steps"] == 2 and "state" in detail["start"]
    assert _runs("runs", "show", run_dir, "w7-r0-e0")[0] == 2
    code, out = _runs("replay", run_dir, "w0-r0-e0")
    assert code == 2 and "the run recorded no actions: set launch.record_actions: true" in out


def test_runs_show_on_a_folder_that_holds_no_run_is_a_usage_error(tmp_path):
    code, out = _runs("runs", "show", tmp_path)
    assert code == 2 and "is not a topo run directory" in out and "--report" in out


def test_reading_runs_imports_no_torch():
    code = "import sys, topo.runtime.episodes, topo.runs.command; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
