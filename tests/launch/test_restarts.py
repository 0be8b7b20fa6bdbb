"""Restarts and hangs on real torchrl (toy env, nothing mocked): a subcollector whose worker died or hung,
or which died or stopped answering itself, starts again with its plan rows while the others keep their
envs; past the budget the run fails naming the worker; blame is exact; nothing the run started is left."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import topo
from topo.runtime.episodes import EpisodeId, Episodes, episode_id, find_run
from topo.runtime.rundir import RESTART_VAR, RUN_DIR_VAR, RunDir

from tests import preimported
from tests.launch.launch_helpers import (HANG_GUARD_S, HERE, LAUNCH_LIMITS, alive, assert_every_unclosed_env_is_named,
                                         launch, subprocess_env, summary, toy_spec, user_spec, wait_for, write)
from tests.launch.script_events import parse

pytestmark = pytest.mark.slow
COLLECT = HERE / "collect.py"
TRAINER = HERE / "trainer.py"


def collect(tmp_path, spec: dict, *args) -> tuple[subprocess.CompletedProcess, list[dict]]:
    path = write(tmp_path / "spec.yaml", spec)
    done = preimported.run([sys.executable, str(COLLECT), str(path), "--report", str(tmp_path / "report"),
                           *map(str, args)], env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    return done, list(parse(done.stdout))


def of(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


def restarting(subcollectors: int = 2, workers: int = 2, restarts: int = 1, hang_timeout: float | None = None,
               **sections) -> dict:
    return toy_spec(subcollectors, workers, launch={**LAUNCH_LIMITS, "restarts": {"max": restarts},
                                                    "hang_timeout": hang_timeout}, **sections)


def planned_groups(spec_path) -> list[list[int]]:
    plan = topo.compile_spec(str(spec_path))
    return [sorted(row["group"] for row in sub["workers"]) for sub in plan["subcollectors"]]


def assert_nothing_left(report: dict, t_end: float) -> None:
    p = report["processes"]
    assert p["left_behind"] == [] and p["alive_after"] == []
    pids = set(p["started"]) | {pid for pid in p["worker_pids"] + p["subcollector_pids"] if pid}
    for r in report["restarts"]:
        pids |= {pid for pid in [r["replaced"]["subcollector"], *r["replaced"]["workers"]] if pid}
    left = alive(pids, t_end)
    assert left == [], [_describe(pid) for pid in left]


def _describe(pid: int) -> dict:
    """What a process left behind is, for the failure message."""
    try:
        proc = psutil.Process(pid)
        return {"pid": pid, "status": proc.status(), "ppid": proc.ppid(), "cmdline": proc.cmdline()[:4],
                "created": proc.create_time(), "run_dir": proc.environ().get(RUN_DIR_VAR),
                "restart": proc.environ().get(RESTART_VAR)}
    except psutil.Error as exc:
        return {"pid": pid, "error": repr(exc)}


@pytest.fixture(scope="module")
def killed_worker_run(tmp_path_factory):
    """The training API, sync, 2 x 2 toy workers, episodes of at most 5 steps, actions recorded: worker 1 of
    subcollector 1 is SIGKILLed after the first batch and its subcollector restarts; 8 iterations."""
    tmp_path = tmp_path_factory.mktemp("killed-worker")
    report_dir = tmp_path / "report"
    spec = write(tmp_path / "toy.yaml", toy_spec(2, 2))
    done = preimported.run([sys.executable, str(TRAINER), str(spec), "--then", "kill-worker", "--restarts", "1",
                           "--iterations", "8", "--report", str(report_dir), "--record-actions",
                           "--max-frames-per-traj", "5"], env=subprocess_env(),
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    t_end = time.time()
    events = list(parse(done.stdout))
    return done, events, spec, report_dir, t_end


def test_a_killed_worker_restarts_its_subcollector_with_its_plan_rows_and_the_pushed_weights(killed_worker_run):
    """Training API, sync: the killed worker's subcollector comes back with the same instructions and
    groups, acting with the weights the trainer pushed; every batch is complete; the restart is reported."""
    done, events, spec, report_dir, t_end = killed_worker_run
    assert done.returncode == 0 and not of(events, "launch-error"), done.stderr
    (killed,) = of(events, "killed")
    batches = of(events, "batch")
    assert [b["versions"] for b in batches] == [[i] for i in range(8)]  # complete, and acting with the pushed weights
    assert max(b["diff"] for b in batches) < 1e-5  # the restarted copy computes what the trainer's does
    plan = topo.compile_spec(str(spec))
    planned = [[{"instructions": [r["instruction"]], "groups": [r["group"]]} for r in sub["workers"]]
               for sub in plan["subcollectors"]]
    assert all(b["rows"] == planned for b in batches)  # before and after the restart, worker for worker
    assert batches[-1]["restarts"] == [[1, "collecting"]]
    (restart,) = of(events, "after")[0]["restarts"]
    cause = restart["cause"]
    assert (cause["kind"], cause["subcollector"], cause["worker"], cause["pid"], cause["how"]) == (
        "worker-died", 1, 1, killed["pid"], "killed by SIGKILL")
    assert restart["seeds"] == {"planned": [106, 107], "applied": [106, 107]}  # plan seeds 102, 103 + 1 x 4 workers
    assert restart["first_batch"]["status"] == "ok" and 0 < restart["recover_s"] < 120
    assert killed["pid"] in restart["replaced"]["workers"]
    assert not set(restart["started"]["workers"]) & set(restart["replaced"]["workers"])
    report = json.loads((report_dir / "summary.json").read_text())
    assert report["ok"] and report["restarts"] == of(events, "after")[0]["restarts"]
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 6}
    assert report["constructions"]["expected"]["worker"] == 6 and report["seeds"]["mismatches"] == []
    assert report["processes"]["subcollector_pids"][1] == restart["started"]["subcollector"]
    assert_every_unclosed_env_is_named(report, {(1, 1, 0): "died (killed by SIGKILL)"}, retired=[(1, 0, 0)])
    assert_nothing_left(report, t_end)


def test_every_episode_of_the_run_resolves_to_its_plan_row_life_seed_and_policy_versions(killed_worker_run):
    """Provenance: each episode id in each batch is recorded with the plan row it ran from, the worker
    life (restart 1 for the restarted subcollector, with its restart seeds) and exactly the policy versions
    the batches show acting in it."""
    done, events, spec, report_dir, _ = killed_worker_run
    assert done.returncode == 0, done.stderr
    seen: dict[int, set] = {}
    for batch in of(events, "batch"):
        for episode, version in batch["episodes"]:
            seen.setdefault(episode, set()).add(version)
    episodes = Episodes(find_run(str(report_dir)))
    rows = {row["global_index"]: row for row in topo.load(str(spec)).rows}
    for value, versions in seen.items():
        e = episodes.get(value)
        row = rows[e.id.row]
        assert (e.row["subcollector"], e.row["index"], e.row["task_id"]) == (row["subcollector"], row["index"], row["task_id"])
        s = e.summary()
        assert s["instruction"] == row["instruction"] and s["group_id"] // 10**6 == row["group"]
        restarted = row["subcollector"] == 1 and e.id.restart == 1
        assert s["seed"] == (row["seed"] + 4 if restarted else row["seed"])  # restart k: planned seed + k x 4 workers
        assert set(s["policy_versions"]) == versions, (str(e.id), versions)
    (listed,) = of(events, "episodes")  # run.episodes(), read by the trainer before the run ended
    assert {episode_id(v) for v in seen} <= set(listed["ids"])
    report = json.loads((report_dir / "summary.json").read_text())
    assert report["episodes"]["recorded"] == len(episodes) and report["episodes"]["actions"] is True
    assert "episodes recorded: " in done.stderr and f"topo runs show {report['run_dir']}" in done.stderr
    lives = {(EpisodeId.of(v).row, EpisodeId.of(v).restart) for v in seen}
    assert lives == {(0, 0), (1, 0), (2, 0), (3, 0), (2, 1), (3, 1)}  # subcollector 1's rows, in both lives
    assert max(EpisodeId.of(v).episode for v in seen) >= 1  # episodes of at most 5 steps: more than one per life


def test_a_recorded_episode_replays_bit_for_bit_and_an_altered_action_is_named(killed_worker_run, tmp_path):
    """`topo replay`: a later episode of the first life and one of the restarted life are rebuilt from their
    rows and seed states and match every recorded step (exit 0); an altered action makes it exit 1 naming
    the first step that differs."""
    done, _, _, report_dir, _ = killed_worker_run
    episodes = Episodes(find_run(str(report_dir)))
    chosen = [max((e for e in episodes if (e.id.row, e.id.restart) == life and e.summary()["recorded_actions"]),
                  key=lambda e: e.id.episode) for life in ((0, 0), (3, 1))]
    for e in chosen:
        assert e.id.episode >= 1  # its reset follows earlier episodes: the recorded seed state is what matters
        replayed = preimported.run(topo_cli("replay", report_dir, str(e.id), "--format", "json"), env=subprocess_env(),
                                   capture_output=True, text=True, timeout=HANG_GUARD_S)
        out = json.loads(replayed.stdout)
        assert replayed.returncode == 0 and out["identical"] and out["steps"] == e.end["steps"] > 0, replayed.stdout
        assert out["replayed_return"] == e.end["return"]
    e = chosen[0]
    altered = episodes.steps(e.id)["action.action"].copy()
    altered[1] += 0.25
    np.savez(tmp_path / "altered.npz", action=altered)
    replayed = preimported.run(topo_cli("replay", report_dir, str(e.id), "--actions", tmp_path / "altered.npz"),
                               env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert replayed.returncode == 1 and "first difference at step 2: reward" in replayed.stdout, replayed.stdout


def topo_cli(*args) -> list[str]:
    return [sys.executable, "-m", "topo", *map(str, args)]


def test_topo_launch_restarts_a_killed_worker_and_reports_it(tmp_path):
    """`topo launch`, sync: worker 1 of subcollector 1 dies by SIGKILL in its 21st step; its subcollector
    starts again with its plan rows, the launch collects every batch asked, exits 0 and reports the restart."""
    spec = user_spec("faulty:dying_step", 2, 2, fault_seed=3, after_steps=20)
    spec["assignment"].update(tasks=[0, 1], instructions={0: "push left", 1: "push right"},
                              groups={"size": 1, "candidate_size": 2})
    spec["launch"]["restarts"] = {"max": 1}
    report = tmp_path / "report"
    result = launch(write(tmp_path / "spec.yaml", spec), "--batches", 40, "--report", report)
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    s = summary(report)
    (restart,) = s["restarts"]
    cause = restart["cause"]
    assert (cause["kind"], cause["subcollector"], cause["worker"], cause["how"]) == ("worker-died", 1, 1,
                                                                                   "killed by SIGKILL")
    assert cause["pid"] in restart["replaced"]["workers"] and restart["row"]["seed"] == 3
    assert restart["seeds"] == {"planned": [6, 7], "applied": [6, 7]}  # seeds 2, 3 + 1 restart x 4 workers
    first = restart["first_batch"]
    assert (first["status"], first["instructions"]) == ("ok", ["push left", "push right"])  # this env has no group ids
    assert s["launch"]["batches_collected"] == 40 and restart["outcome"] == "collecting"
    assert 0 < restart["recover_s"] < 120
    new_pids = f"pids {restart['started']['subcollector']} {restart['started']['workers']}"
    assert ("restart 1 of sub1 at " in result.stdout and "sub1/w1 worker-died (killed by SIGKILL); first batch"
            in result.stdout and f"{new_pids}, seeds [6, 7]" in result.stdout), result.stdout
    assert_every_unclosed_env_is_named(s, {(1, 1, 0): "died (killed by SIGKILL)"}, retired=[(1, 0, 0)])
    (closes,) = [line for line in result.stdout.splitlines() if "env closes" in line]
    assert "(not closed: " in closes and "1 died (killed by SIGKILL)" in closes, closes
    assert_nothing_left(s, t_end)


def test_without_restarts_a_killed_fork_worker_is_blamed_exactly(tmp_path):
    """The issue's case: forked workers, 2 x 3, worker 1 of subcollector 1 SIGKILLed while collecting; the
    launch fails naming that worker alone, not a neighbour or its subcollector (torchrl's own failure)."""
    spec = user_spec("faulty:dying_step", 2, 3, fault_seed=4, after_steps=5)
    spec["topology"]["start_method"] = {"workers": "fork"}
    report = tmp_path / "report"
    result = launch(write(tmp_path / "spec.yaml", spec), "--batches", 10**6, "--report", report, "--quiet")
    t_end = time.time()
    assert result.returncode == 1, result.stderr
    assert "env worker died while collecting without a traceback (killed by SIGKILL" in result.stderr
    assert "at subcollector 1, worker 1" in result.stderr and "seed=4" in result.stderr
    assert "At least one process failed" not in result.stderr
    s = summary(report)
    failure = s["error"]["failure"]
    assert (failure["kind"], failure["subcollector"], failure["worker"]) == ("worker-died", 1, 1)
    assert failure["pid"] == s["processes"]["worker_pids"][4]
    assert_nothing_left(s, t_end)


def test_async_a_killed_worker_loses_only_its_subcollector_rollout(tmp_path):
    """A launch whose worker is SIGKILLed at batch 2, then 10 batches more: the restart (its subcollector started again,
    its envs rebuilt) happens while the other subcollector collects, and the test waits until the restarted one
    delivers again."""
    spec = restarting(collector={"sync": False})
    done, events = collect(tmp_path, spec, "--do", "kill:worker:0:1", "--at", 2, "--after", 10)
    t_end = time.time()
    assert done.returncode == 0 and not of(events, "launch-error"), done.stderr
    (action,) = of(events, "done")
    batches = of(events, "batch")
    sub0, sub1 = planned_groups(tmp_path / "spec.yaml")
    assert all(b["groups"] in (sub0, sub1) for b in batches)  # each async batch: one subcollector's planned rows
    during = [b for b in batches if b["restarts"] and b["restarts"][0][1] == "starting"]
    # the other one went on while sub0 restarted; of sub0, at most the rollout it had delivered before the kill was
    # seen (queued before the restart was decided: the first batch after it), none collected by the dead start
    assert any(b["groups"] == sub1 for b in during)
    assert all(b["groups"] == sub1 for b in during[1:]), [b["groups"] for b in during]
    assert any(b["groups"] == sub0 and b["restarts"] == [[0, "collecting"]] for b in batches)  # sub0 is back
    report = of(events, "after")[0]["report"]
    (restart,) = report["restarts"]
    assert (restart["cause"]["kind"], restart["cause"]["worker"], restart["cause"]["pid"]) == ("worker-died", 1,
                                                                                            action["pid"])
    assert report["ok"] and report["constructions"]["by_role"]["worker"] == 6
    assert_nothing_left(report, t_end)


def test_a_hung_step_a_killed_subcollector_and_one_that_stops_answering_each_restart_it(tmp_path):
    """One run, three restarts in turn, each once the one before collects: the env step of worker 1 of
    subcollector 1 never returns (found, named, restarted); then subcollector 1 is SIGKILLed (restarted);
    then subcollector 0 is SIGSTOPped: found by its missing steps within hang_timeout, killed, restarted."""
    spec = user_spec("faulty:hanging_step", 2, 2, fault_seed=3, after_steps=4)
    spec["assignment"].update(tasks=[0, 1], instructions={0: "push left", 1: "push right"},
                              groups={"size": 1, "candidate_size": 2})
    spec["launch"].update(restarts={"max": 3}, hang_timeout=3)
    done, events = collect(tmp_path, spec, "--faults", 1, "--do", "kill:subcollector:1", "--do", "stop:subcollector:0",
                           "--after", 4)
    t_end = time.time()
    assert done.returncode == 0 and not of(events, "launch-error"), done.stderr
    killed, stopped = of(events, "done")
    assert (killed["action"], stopped["action"]) == ("kill:subcollector:1", "stop:subcollector:0")
    report = of(events, "after")[0]["report"]
    step, died, hung = report["restarts"]

    cause = step["cause"]
    assert (cause["kind"], cause["subcollector"], cause["worker"]) == ("worker-hung", 1, 1)  # seed 3: global index 3
    assert "its step has not returned for" in cause["message"] and cause["pid"] in step["replaced"]["workers"]
    assert step["seeds"]["applied"] == [6, 7]  # seeds 2, 3 + 4: the restart does not hang

    assert (died["cause"]["kind"], died["cause"]["subcollector"], died["cause"]["pid"], died["cause"]["how"]) \
        == ("subcollector-died", 1, killed["pid"], "killed by SIGKILL")
    assert died["first_batch"]["status"] == "ok"

    cause = hung["cause"]
    assert (cause["kind"], cause["subcollector"], cause["pid"]) == ("subcollector-hung", 0, stopped["pid"])
    assert "no env step for" in cause["message"] and "hang_timeout 3s" in cause["message"]
    found_after = cause["at"] - stopped["time"] + hung["decided_s"] - hung["failed_s"]
    assert 2.5 < found_after < 3 + 1.5  # the deadline after its last step or ask, + the heartbeat scan
    assert report["processes"]["subcollector_exit_codes"] == [0, 0]  # the restarted ones shut down cleanly
    assert_nothing_left(report, t_end)


def test_sigkill_of_the_trainer_during_a_restart_leaves_no_process(tmp_path):
    """The trainer (its policy's weights pushed to every subcollector) dies while subcollector 1 starts again
    (its worker 1 killed): the watcher ends the old processes and the new; every process of the run, found by
    its environment (forkservers included), is gone."""
    spec = write(tmp_path / "toy.yaml", toy_spec(2, 2))
    proc = preimported.popen([sys.executable, str(TRAINER), str(spec), "--then", "kill-worker", "--restarts", "1",
                             "--iterations", str(10**9), "--report", str(tmp_path / "report")],
                             env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = _event(proc, "ready")
        run_dir = ready["run_dir"]
        _event(proc, "killed")
        _event(proc, "update")  # a weight update reached the subcollectors
        markers = lambda: RunDir(run_dir).read_all("markers")  # noqa: E731
        restarted = wait_for(lambda: [m["pid"] for m in markers() if m["restart"]], what="a process of the restart")
        running = {m["pid"] for m in markers() if not m["restart"] and _subcollector_of(m) == 0}  # not restarted
        ours = _of_run(run_dir)
        assert len(running) == 1 + 2 and running | set(restarted) <= set(ours)
        assert set(ours) - {m["pid"] for m in markers()}  # a forkserver: named by no marker, found by its environment
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: os.path.exists(os.path.join(run_dir, "watcher.json")), timeout=60, what="the watcher's record")
    record = json.loads(open(os.path.join(run_dir, "watcher.json")).read())
    named = {m["pid"] for m in markers()}  # first starts and the restart's processes
    assert record["trainer"] == ready["trainer"]
    assert set(restarted) <= named and (running | set(restarted)) <= set(record["terminated"])
    assert record["left"] == []
    wait_for(lambda: alive(named, time.time()) == [], timeout=30, what="every process of the run to be gone")
    wait_for(lambda: not _of_run(run_dir), timeout=30, what="every process of the run to be gone, by environment")
    assert alive(set(ours), time.time()) == []


def _subcollector_of(marker: dict) -> int | None:
    """The subcollector a marker's process belongs to (its own, a worker's, or its policy's)."""
    if "worker" in marker:
        return marker["worker"]["subcollector"]
    return marker["index"] if marker["name"] == "subcollector" else marker.get("subcollector")


def _of_run(run_dir: str) -> list[int]:
    """The pids of every live process whose environment names ``run_dir``."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(RUN_DIR_VAR) == run_dir:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def test_a_hung_step_without_restarts_fails_naming_the_worker(tmp_path):
    """A worker hangs after 3 steps; the run must wait out hang_timeout (3 s) past the hang, then fail and tear down
    every process: the launch, the hang and the teardown make its length."""
    spec = user_spec("faulty:hanging_step", 2, 2, fault_seed=2, after_steps=3)
    spec["launch"]["hang_timeout"] = 3
    report = tmp_path / "report"
    result = launch(write(tmp_path / "hang.yaml", spec), "--batches", 10**6, "--report", report, "--quiet")
    t_end = time.time()
    assert result.returncode == 1, result.stderr
    assert "env worker hung while collecting: its step has not returned for" in result.stderr
    assert "restarts are off (launch.restarts)" in result.stderr
    assert "at subcollector 1, worker 0" in result.stderr and "seed=2" in result.stderr
    s = summary(report)
    assert s["error"]["failure"]["kind"] == "worker-hung" and s["restarts"] == []
    assert s["error"]["failure"]["pid"] in s["processes"]["worker_pids"]
    assert_nothing_left(s, t_end)


def test_past_the_budget_the_run_fails_naming_the_worker(tmp_path):
    """Every restart's builder raises: restarts until the budget is spent, then exit 1 with that worker."""
    spec = user_spec("faulty:raising_when_restarted", 2, 2, fault_seed=2, stride=4)
    spec["launch"]["restarts"] = {"max": 2, "window": 600}
    done, events = collect(tmp_path, spec, "--do", "kill:worker:1:0")
    t_end = time.time()
    (err,) = of(events, "launch-error")
    assert (err["subcollector"], err["worker"], err["row"]["seed"]) == (1, 0, 2 + 2 * 4)  # restart 2's seed
    assert "env worker failed during construction (restart 2): RuntimeError: planted failure" in err["message"]
    assert "the restart budget is spent (launch.restarts: 2 within 600s)" in err["message"]
    report = of(events, "after")[0]["report"]
    assert report["exit_code"] == 1 and [r["restart"] for r in report["restarts"]] == [1, 2]
    assert [r["cause"]["kind"] for r in report["restarts"]] == ["worker-died", "builder-raised"]
    assert [r["outcome"] for r in report["restarts"]] == ["superseded", "starting"]
    assert_nothing_left(report, t_end)


def test_blame_is_exact_over_repeated_kills_with_fork_workers(tmp_path):
    """Forked env workers (the start method whose deaths raced torchrl's own check before): each kill of a
    random worker is blamed on that worker, with its signal."""
    spec = restarting(2, 3, restarts=3)
    spec["topology"]["start_method"] = {"workers": "fork"}
    path = write(tmp_path / "spec.yaml", spec)
    proc = preimported.popen([sys.executable, str(COLLECT), str(path), "--report", str(tmp_path / "report"),
                             "--after", str(10**6)],
                             env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rng = random.Random(11)
    killed = []
    try:
        ready = _event(proc, "ready")
        for k in range(3):
            wait_for(lambda: _all_collecting(RunDir(ready["run_dir"]), k), what=f"restart {k} collecting")
            c, w = rng.randrange(2), rng.randrange(3)
            pid = _current_pid(RunDir(ready["run_dir"]), c, w)
            os.kill(pid, signal.SIGKILL)
            killed.append((c, w, pid))
        wait_for(lambda: _all_collecting(RunDir(ready["run_dir"]), 3), what="the last restart collecting")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=HANG_GUARD_S)
    report = json.loads((tmp_path / "report" / "summary.json").read_text())
    blamed = [(r["cause"]["subcollector"], r["cause"]["worker"], r["cause"]["pid"]) for r in report["restarts"]]
    assert blamed == killed
    assert all(r["cause"]["how"] == "killed by SIGKILL" for r in report["restarts"])
    assert_nothing_left(report, time.time())


def _event(proc: subprocess.Popen, name: str) -> dict:
    while True:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"no {name} event")
        for event in parse([line]):
            if event["event"] == name:
                return event


def _all_collecting(run, restarts: int) -> bool:
    """``restarts`` restarts so far, the last one collecting: its observed record exists."""
    starts = [m for m in run.read_all("markers") if m["name"] == "subcollector" and m["restart"]]
    return len(starts) == restarts and all(
        os.path.exists(os.path.join(run.path, "observed", f"sub{m['index']}.r{m['restart']}.json")) for m in starts)


def _current_pid(run, c: int, w: int) -> int:
    built = [m for m in run.read_all("markers") if m["name"] == "constructed"
             and (m["worker"]["subcollector"], m["worker"]["index"]) == (c, w)]
    return max(built, key=lambda m: m["restart"])["pid"]
