"""collector.mode: async with real processes (toy, 2 x 2): the plan rows in the env workers, 0 envs built outside
them, every step's row, episode and policy version, the trainer's weights and evaluation, the report, a dead worker named
by its row or restarted from it, nothing left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import topo

from topo.runtime.rundir import RunDir

from tests import preimported
from tests.launch.launch_helpers import (HERE, LAUNCH_LIMITS, alive, guarded, records, started_pids, subprocess_env,
                                         toy_spec, wait_for, write)
from tests.launch.script_events import parse
from tests.launch.test_restarts import _event, _of_run

POLICY = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}

pytestmark = pytest.mark.slow


def async_spec(tmp_path, launch: dict | None = None, **sections):
    """Toy 2 x 2 in async mode; ``launch``: keys added to the launch section."""
    launch = {**LAUNCH_LIMITS, "startup_timeout": 600, **(launch or {})}  # spawned workers: N torch imports
    sections = {"policy": POLICY, **sections}
    return write(tmp_path / "async.yaml", toy_spec(2, 2, collector={"mode": "async", "frames_per_batch": 16},
                                                   launch=launch, **sections))


def train(spec, report, *args, paths=()) -> list[dict]:
    """``async_trainer.py``'s events (``paths``: more folders on the run's PYTHONPATH)."""
    done = guarded([sys.executable, str(HERE / "async_trainer.py"), str(spec), str(report), *map(str, args)],
                   env=subprocess_env(*paths))
    assert done.returncode == 0, done.stderr
    return list(parse(done.stdout))


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory):
    """One async run, no fault, 4 batches, its policy's forward 100 ms slower (``slow_policy.py``: TinyVLA, then a
    sleep): the spec, report folder, events and end time, read by the two tests below."""
    tmp_path = tmp_path_factory.mktemp("slow")
    slow = {"factory": "slow_policy:make", "kwargs": {"delay": 0.1, **POLICY["kwargs"]}}
    spec, report = async_spec(tmp_path, policy=slow), tmp_path / "report"
    events = train(spec, report, 4)
    return spec, report, events, time.time()


def test_async_rows_records_and_report(slow_run, monkeypatch):
    """The plan rows in the env workers, 0 envs built outside them, every step's row and episode, the report, the run
    shown by `topo runs show` (the run behind a slow forward, shared with the inference-bound test: nothing here
    depends on the policy's speed)."""
    spec, report, events, t_end = slow_run
    monkeypatch.syspath_prepend(str(HERE))  # the spec's policy factory, slow_policy:make, as the run imported it
    plan = topo.compile_spec(str(spec))
    rows = {(r["subcollector"], r["index"]): r for sub in plan["subcollectors"] for r in sub["workers"]}
    batches = [e for e in events if e["event"] == "batch"]
    assert [e for e in events if e["event"] == "launch-error"] == []
    assert [b["frames"] for b in batches] == [16] * 4
    assert all(b["versions"] == [0] and b["step_rows_match"] for b in batches)  # each step: its row's episode
    assert all(tuple(r) in rows for b in batches for r in b["rows"])
    (after,) = [e for e in events if e["event"] == "after"]
    s = after["report"]
    assert s["ok"] and s["plan"]["collector"]["mode"] == "async"
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    markers = records(report, "markers")
    built = [m for m in markers if m["name"] == "constructed"]
    (server,) = [m for m in markers if m["name"] == "server"]
    assert sorted((m["worker"]["subcollector"], m["worker"]["index"]) for m in built) == sorted(rows)
    assert len({m["pid"] for m in built} | {server["pid"], s["processes"]["trainer_pid"]}) == 6  # one env per process
    assert all(m["seed"] == rows[m["worker"]["subcollector"], m["worker"]["index"]]["seed"] for m in built)
    assert s["seeds"]["mismatches"] == [] and s["env_closes"] == {"constructed": 4, "closed": 4}
    assert [e["status"] for e in s["first_batch"]] != ["not observed"] * 2
    assert all(e["status"] in ("ok", "not observed") and not e.get("mismatches") for e in s["first_batch"])
    assert s["processes"]["left_behind"] == [] and s["processes"]["alive_after"] == []
    assert alive(started_pids(report), t_end) == []
    shown = preimported.run([sys.executable, "-m", "topo", "runs", "show", s["run_dir"], "--format", "json"], env=subprocess_env(),
                            capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "push left" in shown.stdout and "push right" in shown.stdout


def test_async_workers_start_from_a_forkserver_of_the_runs_own_ended_with_it(tmp_path):
    """Two async runs in one process: each starts its env workers and server from a forkserver of its own (the
    first run's preload would not be the second's), and none outlives its run."""
    spec = async_spec(tmp_path)
    done = guarded([sys.executable, str(HERE / "two_async_runs.py"), str(spec), str(tmp_path / "reports")],
                   env=subprocess_env())
    assert done.returncode == 0, done.stderr
    runs = [e for e in parse(done.stdout) if e["event"] == "run"]
    assert [len(r["during"]) for r in runs] == [1, 1] and runs[0]["during"] != runs[1]["during"]
    assert [r["after"] for r in runs] == [[], []] and [r["children"] for r in runs] == [[], []]


def test_an_async_run_behind_a_100_ms_forward_is_called_inference_bound(slow_run):
    """Each worker's own wait for the server, between its steps, is the run's inference wait (async mode has no
    subcollector calling a policy)."""
    _, _, events, _ = slow_run
    (after,) = [e for e in events if e["event"] == "after"]
    figures = after["report"]["time_breakdown"]
    assert figures["verdict"] == "inference-bound", figures["line"]
    for row in figures["subcollectors"]:
        assert row["inference_wait_ms"]["p50"] >= 90 > row["env_step_ms"]["p50"], row


def test_a_killed_async_worker_is_named_by_its_row_and_nothing_is_left(tmp_path):
    spec, report = async_spec(tmp_path), tmp_path / "report"
    events = train(spec, report, 50, "kill-worker")
    t_end = time.time()
    (killed,) = [e for e in events if e["event"] == "killed"]
    (err,) = [e for e in events if e["event"] == "launch-error"]
    assert (err["subcollector"], err["worker"]) == (1, 1)
    assert f"env worker died while collecting without a traceback (killed by SIGKILL, pid {killed['pid']})" \
        in err["message"]
    (after,) = [e for e in events if e["event"] == "after"]
    assert not after["report"]["ok"] and after["report"]["error"]["failure"]["kind"] == "worker-died"
    assert after["report"]["processes"]["left_behind"] == []
    assert alive(started_pids(report), t_end) == []


FAULTS = ["kill-and-recover", "hang-and-recover", "stop-mid-message"]


def test_a_killed_a_stopped_and_a_half_message_async_worker_each_restart_from_its_row_in_the_same_slots(tmp_path):
    """launch.restarts and launch.hang_timeout in async mode, one run, three faults in turn, each to worker (1, 1) of
    the life the one before started, once both workers of subcollector 1 delivered steps of it:

    - SIGKILLed: its subcollector's rows start again in life 1 (the restart's seeds), in the server's same slots, while
      subcollector 0 steps on; the new lives' steps reach the trainer; the report names the cause, the pids replaced
      and started;
    - SIGSTOPped (wherever it was: in a step, or waiting for its action): it has not stepped while the trainer waits
      for a batch; it is named, SIGKILLed, its rows restarted;
    - it writes half of a result message to its channel and stops (``stop_mid_message/sitecustomize.py``): the trainer
      takes the other workers' messages meanwhile (nothing of the stopped one's is a lock or a descriptor it must
      fetch), finds it hung, SIGKILLs it, throws its half message away and restarts its rows;

    both subcollectors step on; nothing is left. Long (~30-40 s on a loaded 2-core machine): a run's start, three
    restarts, and twice a hang_timeout of 5 s to wait out (one launch instead of three)."""
    spec = async_spec(tmp_path, launch={"restarts": {"max": 3}, "hang_timeout": 5})
    report = tmp_path / "report"
    events = train(spec, report, 3000, "+".join(FAULTS), paths=[HERE / "stop_mid_message"])
    t_end = time.time()
    assert [e for e in events if e["event"] == "launch-error"] == []
    killed = [e for e in events if e["event"] == "killed"]
    assert [(e["mode"], e["life"]) for e in killed] == [(m, k) for k, m in enumerate(FAULTS)]
    batches = [e for e in events if e["event"] == "batch"]
    lives = {tuple(life) for e in batches for life in e["lives"]}
    assert {(1, w, k) for w in (0, 1) for k in (1, 2, 3)} <= lives
    assert {(0, 0, 0), (0, 1, 0)} <= lives  # subcollector 0 was never restarted
    assert not {life for life in lives if life[:2] in ((0, 0), (0, 1)) and life[2] != 0}
    assert all(e["step_rows_match"] for e in batches)
    (after,) = [e for e in events if e["event"] == "after"]
    s = after["report"]
    assert s["ok"]
    built = {(m["worker"]["subcollector"], m["worker"]["index"], m["restart"]): m["pid"]
             for m in records(report, "markers") if m["name"] == "constructed"}
    assert len(s["restarts"]) == 3
    for k, (restart, fault) in enumerate(zip(s["restarts"], killed), start=1):
        assert (restart["subcollector"], restart["restart"], restart["outcome"]) == (1, k, "collecting")
        cause = restart["cause"]
        assert (cause["subcollector"], cause["worker"], cause["pid"]) == (1, 1, fault["pid"])
        if fault["mode"] == "kill-and-recover":
            assert cause["kind"] == "worker-died" and cause["how"] == "killed by SIGKILL"
        else:
            assert cause["kind"] == "worker-hung" and "(hang_timeout 5s, pid" in cause["message"]
        assert restart["replaced"]["workers"] == [built[1, 0, k - 1], built[1, 1, k - 1]]
        assert restart["started"]["workers"] == [built[1, 0, k], built[1, 1, k]]
        assert restart["seeds"]["planned"] == restart["seeds"]["applied"] == [102 + 4 * k, 103 + 4 * k]  # + k x 4
        assert restart["first_batch"]["status"] == "ok"
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4 + 3 * 2}
    assert s["processes"]["left_behind"] == [] and s["processes"]["alive_after"] == []
    assert alive(started_pids(report), t_end) == []


def test_async_workers_past_a_health_budget_are_rebuilt_between_batches(tmp_path):
    """launch.recycle in async mode: every worker past max_rss_gb (a spawned worker holds torch: over 200 MB), read
    every 50 batches; each subcollector's rows rebuilt (the restart's seeds), no restart budget spent, the run goes on."""
    spec = async_spec(tmp_path, launch={"recycle": {"max_rss_gb": 0.2, "check_every": 50}})
    events = train(spec, tmp_path / "report", 2000, "recycle")
    assert [e for e in events if e["event"] == "launch-error"] == []
    lives = {tuple(life) for e in events if e["event"] == "batch" for life in e["lives"]}
    assert {(c, w, 1) for c in (0, 1) for w in (0, 1)} <= lives
    s = [e for e in events if e["event"] == "after"][0]["report"]
    first = {r["subcollector"]: r for r in reversed(s["recycles"])}  # each subcollector's first recycle
    assert sorted(first) == [0, 1] and s["restarts"] == []
    assert all(r["breach"]["budget"] == "max_rss_gb" and r["reason"].endswith("> max_rss_gb 0.2") for r in s["recycles"])
    assert first[1]["seeds"]["planned"] == first[1]["seeds"]["applied"] == [106, 107]
    assert s["ok"] and s["processes"]["left_behind"] == [] and s["processes"]["alive_after"] == []


def test_the_trainers_weights_reach_the_server_and_every_step_is_acted_with_the_version_it_names(tmp_path):
    """Async GRPO's premise: a batch may mix versions, and each step's ``policy_version`` names the weights it was
    acted with: the log-probability the server stamped is the one those weights give, to float precision."""
    spec = async_spec(tmp_path, eval={"tasks": [3], "trials": 4, "workers": 2, "max_episode_steps": 6, "every": 2,
                                      "seeds": {"base": 1000}})
    report = tmp_path / "report"
    events = train(spec, report, 5, "update-weights")
    assert [e for e in events if e["event"] == "launch-error"] == []
    pushed = [e for e in events if e["event"] == "pushed"]
    assert [(e["version"], e["policy_version"]) for e in pushed] == [(v, v) for v in range(1, 6)]
    acted = [e["versions"] for e in events if e["event"] == "acted"]
    assert list(acted[0]) == ["0"]  # before the first push: the factory's weights
    seen = {int(v) for versions in acted for v in versions}
    assert max(seen) >= 2 and all(int(v) <= i for i, versions in enumerate(acted) for v in versions), acted  # never ahead
    gaps = [g["log_prob_gap"] for versions in acted for g in versions.values()]
    assert max(gaps) < 1e-3, acted
    assert min(g["gap_to_version_0"] for versions in acted for v, g in versions.items() if v != "0") > 1e-2  # could fail
    (after,) = [e for e in events if e["event"] == "after"]
    s = after["report"]
    assert s["ok"] and s["policy"]["placement"] == "server" and s["policy"]["updates"] == 5
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    # the eval rows (held-out task 3) in a sync collector of their own, every 2 pushes, with the pushed weights
    (evaluations,) = [e["results"] for e in events if e["event"] == "evaluations"]
    assert [(r["round"], r["step"], r["policy_version"], r["episodes"]) for r in evaluations] == [(1, 2, 2, 4), (2, 4, 4, 4)]


def test_a_sigkilled_async_trainer_leaves_no_process_of_its_run(tmp_path):
    """The trainer dies while its env workers and server step on their own: the watcher ends them all."""
    spec = async_spec(tmp_path)
    proc = preimported.popen([sys.executable, str(HERE / "async_trainer.py"), str(spec), str(tmp_path / "report"),
                             str(10**9)], env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    try:
        run_dir = _event(proc, "batch")["run_dir"]
        named = {m["pid"] for m in RunDir(run_dir).read_all("markers") if m["name"] in ("constructed", "server")}
        ours = _of_run(run_dir)
        seen_at = time.time()  # a pid alive later but started after this is another process's (reused)
        assert len(named) == 4 + 1 and named <= set(ours)  # four env workers and the server
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: os.path.exists(os.path.join(run_dir, "watcher.json")), timeout=60, what="the watcher's record")
    record = json.loads(open(os.path.join(run_dir, "watcher.json")).read())
    assert record["left"] == []  # ended by the watcher, or by themselves (torchrl's workers watch their parent)
    wait_for(lambda: not _of_run(run_dir), timeout=30, what="every process of the run to be gone, by environment")
    # one exiting has no environment to read but may run for a moment: gone by pid too, within the same bound
    wait_for(lambda: not alive(set(ours) | named, seen_at), timeout=30, what="every process of the run to be gone, by pid")
