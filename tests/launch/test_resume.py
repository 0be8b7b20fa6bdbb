"""A trainer SIGKILLed after 20 batches, resumed from its checkpoint (weights + ``run.state_dict()``) for 20 more: real
processes, toy 2 x 2, 4 steps a worker a batch, an evaluation every 5 updates, actions recorded.

40 batches in all; no episode id in both runs' records (training and eval); each worker's seeds the plan's stream
continued (planned + life x 4); eval rounds 1-4 then 5-8; policy versions 0-19 then 20-39; an episode from before and
one from after replay bit for bit; nothing of either run is left (processes, their shared memory)."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import topo
from topo.runtime.episodes import Episodes

from tests import preimported
from tests.launch.launch_helpers import HANG_GUARD_S, HERE, LAUNCH_LIMITS, alive, subprocess_env, toy_spec, write
from tests.launch.script_events import parse
from tests.launch.test_evaluation import of_runs

BATCHES, KILLED_AFTER, WORKERS, EVERY = 40, 20, 4, 5


def train(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    done = preimported.run([sys.executable, str(HERE / "resume_trainer.py"), str(tmp_path / "spec.yaml"), "--report",
                           str(tmp_path / "report"), "--checkpoint", str(tmp_path / "ckpt.pt"), "--batches",
                           str(BATCHES), *args], env=subprocess_env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    return done, list(parse(done.stdout))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    data = toy_spec(2, 2, launch=dict(LAUNCH_LIMITS, record_actions=True))
    data["assignment"]["tasks"] = [0, 1]
    data["collector"] = {"frames_per_batch": 4 * WORKERS}
    data["policy"] = {"factory": "topo.policies.tinyvla:make",
                      "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}
    data["eval"] = {"tasks": [2], "trials": 2, "workers": 2, "max_episode_steps": 6, "every": EVERY}
    write(tmp / "spec.yaml", data)
    killed, first = train(tmp, "--kill-after", str(KILLED_AFTER))
    t_killed = time.time()
    run1 = next(e["run_dir"] for e in first if e["event"] == "ready")
    deadline = time.monotonic() + 60  # the watchers' shares: terminate, kill, then the eval run's own
    while of_runs(run1, *eval_runs(run1)) and time.monotonic() < deadline:
        time.sleep(0.5)
    done, second = train(tmp, "--resume")
    return {"killed": killed, "first": first, "done": done, "second": second, "t_killed": t_killed, "t_end": time.time(),
            "run1": run1, "run2": next(e["run_dir"] for e in second if e["event"] == "ready"),
            "plan": topo.load(str(tmp / "spec.yaml")).data}


def eval_runs(run_dir: str) -> list[str]:
    return glob.glob(os.path.join(run_dir, "eval", "collector", "topo-run-*"))


def batches(events: list[dict]) -> list[dict]:
    return [e for e in events if e["event"] == "batch"]


@pytest.mark.slow
def test_the_resumed_run_delivers_the_batches_the_killed_one_did_not(resumed):
    assert resumed["killed"].returncode == -signal.SIGKILL
    assert resumed["done"].returncode == 0, resumed["done"].stderr[-3000:]
    first, second = batches(resumed["first"]), batches(resumed["second"])
    assert [b["number"] for b in first + second] == list(range(1, BATCHES + 1))
    # the versions continue: each batch acted with the weights pushed after the batch before, across the kill
    assert [b["versions"] for b in first + second] == [[v] for v in range(BATCHES)]
    assert [b["pushed"] for b in first + second] == list(range(1, BATCHES + 1))
    summary = next(e["summary"] for e in resumed["second"] if e["event"] == "report")
    assert summary["ok"] and summary["launch"]["resumes"] == resumed["run1"]


@pytest.mark.slow
def test_no_episode_id_repeats_and_each_worker_continues_its_seed_stream(resumed):
    """Run 1's workers are life 0 (seed 100 + row), run 2's life 1 (seed 100 + row + 1 x 4), as a restart's are."""
    before, after = Episodes(resumed["run1"]), Episodes(resumed["run2"])
    ids = [str(e.id) for e in before] + [str(e.id) for e in after]
    assert len(ids) == len(set(ids))
    assert {(e.id.restart, e.id.eval) for e in before} == {(0, False), (0, True)}
    assert {(e.id.restart, e.id.eval) for e in after} == {(1, False), (1, True)}
    for episodes, life in ((before, 0), (after, 1)):
        training = [e for e in episodes if not e.id.eval]
        assert {(e.id.row, e.start["seed"]) for e in training} == {(g, 100 + g + life * WORKERS) for g in range(WORKERS)}
        # one 4-step episode a worker a batch: ordinals 0-19 in each life (the last one open when its run ended)
        assert set(range(20)) <= {e.id.episode for e in training if e.end is not None and e.end["steps"] == 4}
    seen = [topo.EpisodeId.of(i) for b in batches(resumed["first"]) + batches(resumed["second"]) for i in b["episodes"]]
    assert {(e.restart, e.episode) for e in seen if e.row == 0} == {(life, k) for life in (0, 1) for k in range(20)}


@pytest.mark.slow
def test_the_evaluation_rounds_continue_on_their_schedule(resumed):
    rounds = [b["rounds"] for b in batches(resumed["first"]) + batches(resumed["second"])]
    assert rounds[KILLED_AFTER - 1] == [1, 2, 3, 4] and rounds[-1] == [5, 6, 7, 8]
    for run, numbers in ((resumed["run1"], [1, 2, 3, 4]), (resumed["run2"], [5, 6, 7, 8])):
        files = sorted(os.path.basename(f) for f in glob.glob(os.path.join(run, "eval", "round-*.json")))
        assert files == [f"round-{n:03d}.json" for n in numbers]
    steps = [json.loads(open(f).read())["step"] for run in (resumed["run1"], resumed["run2"])
             for f in sorted(glob.glob(os.path.join(run, "eval", "round-*.json")))]
    assert steps == [5, 10, 15, 20, 25, 30, 35, 40]  # eval.every 5, on the version: the schedule continues
    eval_episodes = [e for run in ("run1", "run2") for e in Episodes(resumed[run]) if e.id.eval]
    assert sorted({e.start["eval_round"] for e in eval_episodes}) == list(range(1, 9))


@pytest.mark.slow
@pytest.mark.parametrize("run, episode", [("run1", "w1-r0-e7"), ("run2", "w3-r1-e12")])
def test_an_episode_from_before_and_one_from_after_replay_bit_for_bit(resumed, run, episode):
    done = preimported.run([sys.executable, "-m", "topo", "replay", resumed[run], episode], env=subprocess_env(),
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every step identical to the recording" in done.stdout


@pytest.mark.slow
def test_nothing_of_either_run_is_left(resumed):
    runs = [resumed["run1"], resumed["run2"], *eval_runs(resumed["run1"]), *eval_runs(resumed["run2"])]
    assert of_runs(*runs) == []
    pids = {e["trainer"] for e in resumed["first"] if e["event"] == "killing"}
    for run in runs:
        pids |= {int(name.split(".")[1]) for name in os.listdir(os.path.join(run, "markers"))}
    assert alive(pids, resumed["t_end"]) == []
    # torch names a shared-memory segment after the process that made it: none of theirs is left
    left = [name for name in os.listdir("/dev/shm") if any(f"_{pid}_" in name for pid in pids)]
    assert left == []


@pytest.mark.slow
def test_topo_launch_resume_continues_a_run_and_refuses_another_plan_s(tmp_path):
    """Two `topo launch` processes (the run, then its resume) and a refused third: the resume is only shown across
    launches."""
    from tests.launch.launch_helpers import launch, summary

    data = toy_spec(2, 2)
    data["collector"] = {"frames_per_batch": 4 * WORKERS}
    spec = write(tmp_path / "spec.yaml", data)
    first = launch(spec, "--batches", "2", "--report", tmp_path / "r1", "--quiet")
    assert first.returncode == 0, first.stderr[-3000:]
    run1 = summary(tmp_path / "r1")["run_dir"]

    second = launch(spec, "--batches", "2", "--report", tmp_path / "r2", "--resume", tmp_path / "r1", "--quiet")
    assert second.returncode == 0, second.stderr[-3000:]
    s = summary(tmp_path / "r2")
    assert s["launch"]["resumes"] == run1
    assert s["seeds"]["checked"] == WORKERS and s["seeds"]["mismatches"] == []
    before, after = Episodes(run1), Episodes(s["run_dir"])
    assert {e.id.restart for e in before} == {0} and {e.id.restart for e in after} == {1}  # the next worker life
    assert sorted(e.start["seed"] for e in after if e.id.episode == 0) == [100 + g + WORKERS for g in range(WORKERS)]

    data["assignment"]["seeds"] = {"base": 7}
    other = write(tmp_path / "other.yaml", data)
    refused = launch(other, "--batches", "1", "--resume", tmp_path / "r1", "--quiet")
    assert refused.returncode == 2 and "seeds.base differs" in refused.stderr, refused.stderr[-2000:]
