"""The recipe's loop (torchrl's vla_grpo) on topo, real processes (toy 2 x 2, TinyVLA): the subcollectors fill a shared
replay buffer in the background (``run.collector.start()``), the trainer updates inside ``pause()``. A worker killed
or hung meanwhile is named with its row and its subcollector restarted; the buffer keeps filling with the pushed
weights; nothing is left."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from topo.runtime.rundir import RunDir

from tests import preimported
from tests.launch.launch_helpers import HANG_GUARD_S, HERE, alive, subprocess_env, toy_spec, wait_for, write
from tests.launch.script_events import parse
from tests.launch.test_restarts import _event, _of_run, assert_nothing_left, of

pytestmark = pytest.mark.slow


def background(tmp_path, *args) -> tuple[list[dict], dict, float]:
    spec = write(tmp_path / "toy.yaml", toy_spec(2, 2))
    done = preimported.run([sys.executable, str(HERE / "background_trainer.py"), str(spec), str(tmp_path / "report"),
                           *map(str, args)], env=subprocess_env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    t_end = time.time()
    events = list(parse(done.stdout))
    assert done.returncode == 0 and not of(events, "starved"), done.stderr[-3000:]
    (after,) = of(events, "after")
    return events, after["report"], t_end


@pytest.fixture(scope="module")
def free_run(tmp_path_factory) -> tuple[list[dict], dict, float]:
    """One background run, no fault: 6 iterations (pause, push, run free), read by the tests below."""
    return background(tmp_path_factory.mktemp("free"), "--iterations", 6)


def test_the_buffer_fills_in_the_background_with_each_pushed_version(free_run):
    """Long when its shared run (free_run, 6 iterations) is started here: ~25-40 s on a loaded 2-core machine."""
    events, report, t_end = free_run
    iterations = of(events, "iteration")
    assert not of(events, "launch-error") and [i["version"] for i in iterations] == [1, 2, 3, 4, 5, 6]
    assert all(i["rows"] >= 64 * (n + 1) for n, i in enumerate(iterations))
    assert iterations[2]["versions"][-1] >= 2  # rows acted with weights pushed inside a pause (by the third)
    # each row's instruction as its worker wrote it (as bytes: a shared buffer shares no strings)
    assert not iterations[-1]["strings"] and iterations[-1]["instructions"] == ["lift", "push left", "push right"]
    assert report["ok"] and report["restarts"] == []
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert_nothing_left(report, t_end)


def test_a_pause_keeps_the_rollout_each_subcollector_had_in_flight(free_run):
    """torchrl's loop drops the rollout a subcollector just made when a message waits for it; for a pause, that
    threw away one rollout per subcollector at every pause. Now every frame the workers stepped is in the buffer,
    but for the rollouts in flight when the run shut down (at most one per subcollector)."""
    events, report, _ = free_run
    (written,) = of(events, "written")
    stepped = sum(sub["env_step_ms"]["count"] for sub in report["time_breakdown"]["subcollectors"])
    assert len(of(events, "iteration")) == 6 and written["frames"] >= 6 * 64
    assert 0 <= stepped - written["frames"] <= 2 * written["rollout"], (stepped, written)


KIND = {"kill-worker": "worker-died", "stop-worker": "worker-hung"}


@pytest.mark.parametrize("placement,faults", [("subcollector", ["kill-worker", "stop-worker"]),
                                              ("server", ["stop-worker", "kill-worker"])],
                         ids=["subcollector-killed-then-hung", "server-hung-then-killed"])
def test_a_worker_killed_and_later_hung_in_the_background_restarts_from_its_row_each_time_and_the_buffer_keeps_filling(
        tmp_path, placement, faults):
    """With the policy in each subcollector, a push waits for the restarting one to acknowledge; on the server (the
    recipe's way), the trainer goes on with the other subcollector's rows meanwhile, so it iterates until the
    restarted one is seen filling the buffer too. One run per placement takes both faults in turn, each kind first
    in one of them: worker 1 of subcollector 1 SIGKILLed (or SIGSTOPped) after iteration 0, then, once its restart
    collects, the worker of that restart SIGSTOPped (or SIGKILLed). Long (~30-40 s on a loaded 2-core machine): a
    run's start, two restarts, and a hang_timeout of 4 s to wait out (one launch instead of two)."""
    events, report, t_end = background(tmp_path, "--iterations", 4, *(a for f in faults for a in ("--then", f)),
                                       "--at", 0, "--restarts", 2, "--hang-timeout", 4, "--placement", placement,
                                       "--until-collecting")
    faulted = of(events, "faulted")
    iterations = of(events, "iteration")
    assert [f["how"] for f in faulted] == faults
    assert not of(events, "launch-error") and len(iterations) >= 4
    assert [i["version"] for i in iterations] == list(range(1, len(iterations) + 1))
    assert report["ok"] and len(report["restarts"]) == 2
    for k, (restart, fault) in enumerate(zip(report["restarts"], faulted), start=1):
        cause = restart["cause"]
        assert (cause["kind"], cause["subcollector"], cause["worker"], cause["pid"]) == (KIND[fault["how"]], 1, 1,
                                                                                         fault["pid"])
        assert restart["restart"] == k and restart["row"]["global_index"] == 3
        assert restart["seeds"]["applied"] == [102 + 4 * k, 103 + 4 * k]  # plan seeds 102, 103 + k restarts x 4
    assert faulted[1]["pid"] in report["restarts"][0]["started"]["workers"]  # the second fault hit the restart's
    assert iterations[-1]["restarts"] == [[1, "collecting"]] * 2  # the restarted subcollector fills the buffer too
    assert iterations[-1]["versions"][-1] >= 3
    assert_nothing_left(report, t_end)


def test_a_sigkilled_trainer_collecting_in_the_background_leaves_no_process(tmp_path):
    """The trainer dies while its subcollectors run free (after a pause and a push): the watcher ends them all."""
    spec = write(tmp_path / "toy.yaml", toy_spec(2, 2))
    proc = preimported.popen([sys.executable, str(HERE / "background_trainer.py"), str(spec), str(tmp_path / "report"),
                             "--iterations", str(10**9)], env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        run_dir = _event(proc, "ready")["run_dir"]
        _event(proc, "iteration")  # paused, pushed, running free again
        named = {m["pid"] for m in RunDir(run_dir).read_all("markers") if "pid" in m}
        ours = _of_run(run_dir)
        assert len(named) >= 2 + 4 and named <= set(ours)  # two subcollectors and four env workers at least
    finally:
        proc.kill()
        proc.wait()
    wait_for(lambda: os.path.exists(os.path.join(run_dir, "watcher.json")), timeout=60, what="the watcher's record")
    record = json.loads(open(os.path.join(run_dir, "watcher.json")).read())
    assert record["left"] == [] and named <= set(record["terminated"])
    wait_for(lambda: not _of_run(run_dir), timeout=30, what="every process of the run to be gone, by environment")
    assert alive(set(ours), time.time()) == []
