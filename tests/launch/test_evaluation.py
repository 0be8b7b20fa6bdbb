"""Evaluation on real torchrl (toy env, real processes): a training script whose spec has an eval section,
every planned episode exactly once per round with the round's weights, async rounds beside training,
``topo eval`` on a checkpoint, and every process gone however the trainer ends."""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from topo.runtime.episodes import Episodes
from topo.runtime.rundir import RUN_DIR_VAR

from tests import preimported
from tests.launch.launch_helpers import HANG_GUARD_S, LAUNCH_LIMITS, alive, subprocess_env, toy_spec, wait_for, write
from tests.launch.script_events import parse

HERE = Path(__file__).resolve().parent
EVAL = {"tasks": [2, 3], "trials": 3, "workers": 4, "max_episode_steps": 6, "every": 2}
# 6 episodes over 4 eval workers: 2, 2, 1, 1; worker 1 runs (task 2, trial 2) then (task 3, trial 0)
PLANNED = [(2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)]


def eval_spec(tmp_path: Path, **eval_overrides) -> Path:
    data = toy_spec(1, 2, launch=dict(LAUNCH_LIMITS, record_actions=True))
    data["env"]["kwargs"].update(success_steps=3)
    data["assignment"]["tasks"] = [0, 1]
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16,
                                                                         "state_dim": 8}}
    data["eval"] = {k: v for k, v in {**EVAL, **eval_overrides}.items() if v is not None}
    return write(tmp_path / "eval.yaml", data)


def train(spec: Path, report: Path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    done = preimported.run([sys.executable, str(HERE / "eval_trainer.py"), str(spec), "--report", str(report), *args],
                           env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    return done, list(parse(done.stdout))


def of_runs(*run_dirs: str) -> list[int]:
    """Live processes whose environment names one of ``run_dirs`` (the training run's, the eval run's)."""
    out = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(RUN_DIR_VAR) in run_dirs and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return out


def eval_run_dir(run_dir: str) -> str:
    (found,) = glob.glob(os.path.join(run_dir, "eval", "collector", "topo-run-*"))
    return found


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One training run with eval.every 2 over 4 updates, a blocking round, then two background ones."""
    tmp = tmp_path_factory.mktemp("eval")
    report = tmp / "report"
    done, events = train(eval_spec(tmp), report)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"report": report, "events": events, "t_end": time.time(), "stderr": done.stderr,
            "run_dir": next(e["run_dir"] for e in events if e["event"] == "ready")}


def rounds(trained) -> list[dict]:
    files = sorted(glob.glob(os.path.join(trained["run_dir"], "eval", "round-*.json")))
    return [json.loads(Path(f).read_text()) for f in files]


@pytest.mark.slow
def test_every_planned_episode_runs_once_per_round_with_that_rounds_weights(trained):
    got = rounds(trained)
    # eval.every 2 after updates 2 and 4, the blocking round, one of the two background ones (busy: skip)
    assert [(r["round"], r["step"], r["policy_version"]) for r in got] == [(1, 2, 2), (2, 4, 4), (3, 100, 4),
                                                                           (4, 200, 4)]
    for r in got:
        detail = r["episodes_detail"]
        assert sorted((e["task_id"], e["trial"]) for e in detail) == PLANNED
        assert all(e["ended"] for e in detail) and r["episodes"] == r["planned"] == 6
        assert {e["acting_version"] for e in detail} == {r["acting_version"]} == {r["round"]}
        assert r["other_weights"] == []
        assert [(e["subcollector"], e["worker"]) for e in detail] == [(0, 0), (0, 0), (0, 1), (0, 1), (0, 2), (0, 3)]
        assert [t["task_id"] for t in r["tasks"]] == [2, 3] and all(t["held_out"] for t in r["tasks"])
    # the same weights (version 4), the same seeds: the same episodes, step for step
    figures = [[(e["success"], e["length"], e["return"], e["checksum"]) for e in r["episodes_detail"]] for r in got[2:]]
    assert figures[0] == figures[1]


@pytest.mark.slow
def test_each_eval_episode_resolves_to_its_planned_episode_and_replays(trained):
    """Provenance of evaluations: the training run's episodes include its eval run's, each one resolving to its
    eval row's planned episode (task, seed) and the round's weights; one replays step for step."""
    episodes = Episodes(str(trained["report"]))
    evals = episodes.select(eval=True)
    assert len(evals) == 4 * len(PLANNED)  # every planned episode once a round, idle steps none
    for e in evals:
        s = e.summary()
        (planned,) = [p for p in e.row["episodes"] if p["episode"] == s["eval_episode"]]
        assert (s["task_id"], s["seed"]) == (planned["task_id"], planned["seed"]) and e.planned == planned
        assert s["policy_versions"] == [s["eval_round"]] and s["steps"] > 0
    assert episodes.select(eval=False)  # and the training episodes beside them
    chosen = max(evals, key=lambda e: (e.start["eval_round"], e.end["steps"]))
    replayed = preimported.run([sys.executable, "-m", "topo", "replay", str(trained["report"]), str(chosen.id),
                               "--format", "json"], env=subprocess_env(), capture_output=True, text=True,
                               timeout=HANG_GUARD_S)
    out = json.loads(replayed.stdout)
    assert replayed.returncode == 0 and out["identical"] and out["steps"] == chosen.end["steps"], replayed.stdout


@pytest.mark.slow
def test_eval_every_blocks_and_async_rounds_let_training_go_on(trained):
    events = trained["events"]
    assert [e["evaluations"] for e in events if e["event"] == "update"] == [0, 1, 1, 2]
    (done,) = [e for e in events if e["event"] == "async"]
    assert done["accepted"] == [True, False]  # busy_policy skip: the second one met the first
    assert done["batches_during"] > 0 and done["rounds"] == 4


@pytest.mark.slow
def test_the_report_carries_the_evaluations_and_the_eval_runs_proof(trained):
    (report,) = [e for e in trained["events"] if e["event"] == "report"]
    s = report["summary"]
    assert s["ok"] and s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    ev = s["evaluation"]
    assert [r["round"] for r in ev["rounds"]] == [1, 2, 3, 4] and ev["skipped"] == 1
    collector = ev["collector"]
    assert collector["ok"] and collector["constructions"]["by_role"] == {"trainer": 0, "server": 0,
                                                                         "subcollector": 0, "worker": 4}
    assert collector["env_closes"] == {"constructed": 4, "closed": 4}
    assert collector["processes"]["left_behind"] == [] and collector["processes"]["alive_after"] == []
    files = sorted(os.listdir(os.path.join(trained["run_dir"], "eval")))
    assert files == ["collector", "results.json", "round-001.json", "round-002.json", "round-003.json",
                     "round-004.json", "success.png"]
    eval_pids = {m["pid"] for m in map(json.loads, (Path(f).read_text() for f in glob.glob(
        os.path.join(eval_run_dir(trained["run_dir"]), "markers", "*.json"))))}
    assert len(eval_pids) >= 5 and alive(eval_pids | set(s["processes"]["started"]), trained["t_end"]) == []


@pytest.mark.slow
def test_a_killed_trainer_leaves_no_process_of_either_run(tmp_path):
    """Over 30 s: a training run, the eval process it starts and that process's own run of eval workers (each
    imports torch), the trainer killed mid-round, then both watchers' teardowns counted down to nothing left."""
    report = tmp_path / "report"
    done, events = train(eval_spec(tmp_path, every=None, max_episode_steps=40), report, "--iterations", "1",
                         "--then", "kill-trainer-during-eval")
    assert done.returncode == -signal.SIGKILL
    run_dir = next(e["run_dir"] for e in events if e["event"] == "ready")
    assert [e["event"] for e in events][-1] == "killing"
    eval_dir = eval_run_dir(run_dir)
    deadline = time.monotonic() + 40  # the watchers' shares: terminate, kill, then the eval run's own
    while of_runs(run_dir, eval_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert of_runs(run_dir, eval_dir) == []
    watcher = Path(run_dir, "watcher.json")  # written once its last scan found nothing, a moment after ours
    wait_for(watcher.exists, timeout=30, what="the watcher's record")
    assert json.loads(watcher.read_text())["left"] == []  # it ended the eval process
    # which tears its run down on SIGTERM, or, killed before it is done, leaves the rest to its run's watcher;
    # the scan above is the proof either way, and whichever record was written agrees
    eval_report, eval_watcher = Path(eval_dir).parent / "summary.json", Path(eval_dir, "watcher.json")
    if eval_report.exists():
        s = json.loads(eval_report.read_text())
        assert s["error"]["message"].startswith("interrupted by SIGTERM") and s["processes"]["alive_after"] == []
    if eval_watcher.exists():
        assert json.loads(eval_watcher.read_text())["left"] == []


def killable_spec(tmp_path: Path, restarts: int) -> Path:
    """The eval spec with a horizon (a round whose worker died cannot wait forever) and ``restarts`` at most."""
    spec = eval_spec(tmp_path, every=None, max_episode_steps=40)
    data = yaml.safe_load(spec.read_text())
    data["launch"]["restarts"] = {"max": restarts}
    write(spec, data)
    return spec


NAMED_WITH_ITS_ROW = ["  at eval subcollector 0, eval worker 1",
                      "  plan row: global_index=1, seed=104, tasks=[2, 3], episodes='2-3'"]


@pytest.mark.slow
@pytest.mark.parametrize("then", ["kill-eval-worker", "kill-eval-worker-between-rounds"])
def test_a_killed_eval_worker_is_named_with_its_row_when_restarts_are_off(tmp_path, then):
    """Eval worker 1 SIGKILLed during a round, or after one while no round runs (the next asked once the eval run
    has judged it): the trainer's evaluate() raises naming the worker and its row. Between rounds, the eval process
    names it and ends at once, and the next round raises its failure, not the BrokenPipeError of a send to a process
    that is gone (found beside two CPU hogs: a kill meant for a round came before the round was sent)."""
    done, events = train(killable_spec(tmp_path, 0), tmp_path / "report", "--iterations", "1", "--then", then)
    (killed,) = [e["pid"] for e in events if e["event"] == "killed"]
    if then == "kill-eval-worker-between-rounds":
        (judged,) = [e for e in events if e["event"] == "judged"]
        assert judged["code"] == 1, (events, done.stderr[-3000:])
    assert done.returncode == 1
    (failed,) = [e["formatted"] for e in events if e["event"] == "failed"]
    assert failed.splitlines() == [
        f"error: evaluation failed: env worker died while collecting without a traceback (killed by SIGKILL, "
        f"pid {killed}); restarts are off (launch.restarts)", *NAMED_WITH_ITS_ROW]


@pytest.mark.slow
def test_eval_workers_killed_between_and_during_rounds_are_restarted_from_their_row(tmp_path):
    """Restarts on, one eval run: eval worker 1 SIGKILLed after a round, while no round runs; its restart is decided
    then (an event in the eval run) and made as the next round begins, whose worker 1 is SIGKILLed during that round
    and restarted again. Each round counts every planned episode once (a restarted worker runs its episodes again)."""
    done, events = train(killable_spec(tmp_path, 2), tmp_path / "report", "--iterations", "1",
                         "--then", "kill-eval-worker-between-then-during-rounds")
    assert done.returncode == 0, done.stderr[-3000:]
    between, during = [e["pid"] for e in events if e["event"] == "killed"]
    (judged,) = [e for e in events if e["event"] == "judged"]
    assert (judged["restart"]["worker"], judged["restart"]["cause"]) == (1, "worker-died")
    first, second = [e["result"] for e in events if e["event"] == "evaluated"]
    for result in (first, second):
        assert_every_planned_episode_ended_once(result)
    restarts = the_eval_restarts(events)
    assert [(r["cause"]["worker"], r["cause"]["kind"], r["cause"]["pid"]) for r in restarts] == [
        (1, "worker-died", between), (1, "worker-died", during)]
    # the first restart's copy may die before its first batch (ready, not collecting); the second ends the round
    assert restarts[0]["outcome"] in ("ready", "collecting") and restarts[1]["outcome"] == "collecting", restarts


def assert_every_planned_episode_ended_once(result: dict) -> None:
    assert sorted((e["task_id"], e["trial"]) for e in result["episodes_detail"]) == PLANNED
    assert result["episodes"] == 6 and all(e["ended"] for e in result["episodes_detail"])


def the_eval_restarts(events: list[dict]) -> list[dict]:
    """The eval run's restarts, from its report (written beside the training run's)."""
    (report_event,) = [e for e in events if e["event"] == "report"]
    collector_dir = eval_run_dir(report_event["summary"]["run_dir"])
    return json.loads(Path(collector_dir).parent.joinpath("summary.json").read_text())["restarts"]


@pytest.mark.slow
def test_topo_eval_evaluates_a_checkpoint_and_refuses_a_plan_without_eval(tmp_path):
    """Its length (33 s beside two CPU hogs): `topo eval` of two rounds, its eval run's forkserver importing torch and
    torchrl, then a refusal before any start."""
    import torch

    from topo.policies.tinyvla import make

    spec = eval_spec(tmp_path, every=None)
    weights = tmp_path / "ckpt.pt"
    torch.save(make(action_dim=4, image_size=16, state_dim=8).state_dict(), weights)
    report = tmp_path / "report"
    done = preimported.run([sys.executable, "-m", "topo.cli", "eval", str(spec), "--weights", str(weights),
                           "--rounds", "2", "--report", str(report)], env=subprocess_env(), capture_output=True,
                           text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("evaluation 1: ") and "policy version of the factory/checkpoint" in lines[0]
    assert sum(line.startswith("evaluation 2: ") for line in lines) == 1
    assert "run ok: 1 subcollector(s), 4 env workers" in done.stdout
    one, two = (json.loads((report / "eval" / f"round-00{n}.json").read_text()) for n in (1, 2))
    assert [e["return"] for e in one["episodes_detail"]] == [e["return"] for e in two["episodes_detail"]]
    summary = json.loads((report / "summary.json").read_text())
    assert summary["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    plain = write(tmp_path / "plain.yaml", toy_spec(1, 1, launch=dict(LAUNCH_LIMITS)))
    refused = preimported.run([sys.executable, "-m", "topo.cli", "eval", str(plain), "--policy",
                              "topo.policies.tinyvla:make"], env=subprocess_env(), capture_output=True, text=True,
                              timeout=120)
    assert refused.returncode == 2 and "this plan has no eval section" in refused.stderr


@pytest.mark.slow
def test_topo_launch_evaluates_once_after_its_batches_and_reports_it(tmp_path):
    """Two `topo launch` processes (with the eval section, then `--no-eval`); the first starts an eval process with its
    own env workers besides the run's."""
    spec = eval_spec(tmp_path, every=None)
    report = tmp_path / "report"
    done = preimported.run([sys.executable, "-m", "topo.cli", "launch", str(spec), "--batches", "2", "--report",
                           str(report)], env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads((report / "summary.json").read_text())
    (round_,) = s["evaluation"]["rounds"]
    assert (round_["round"], round_["policy_version"], round_["episodes"], round_["planned"]) == (1, 0, 6, 6)
    assert "  evaluation: 1 round(s), 0 skipped; last: " in done.stdout
    assert "    eval workers: 4, env constructions trainer 0, server 0, subcollector 0, worker 4, env closes 4/4, " \
           "left behind 0, alive after 0" in done.stdout
    no_eval = preimported.run([sys.executable, "-m", "topo.cli", "launch", str(spec), "--no-eval", "--report",
                              str(tmp_path / "plain")], env=subprocess_env(), capture_output=True, text=True,
                              timeout=HANG_GUARD_S)
    assert no_eval.returncode == 0 and "evaluation" not in no_eval.stdout
