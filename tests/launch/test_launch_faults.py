"""Faults during a real launch: the message names the worker to blame, the exit code says what
happened, and every process the launch started is gone (checked by pid) when `topo launch` returns.
A subcollector SIGKILLed while collecting: tests/launch/test_training_api.py (the same failure, its message,
exit code and teardown, with a weight update in flight)."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time

import pytest

from tests import preimported
from tests.launch.launch_helpers import (HANG_GUARD_S, alive, command, launch, records, started_pids, subprocess_env, summary,
                            toy_spec, user_spec, wait_for, write)

pytestmark = pytest.mark.slow


def assert_torn_down(report, t_end: float) -> dict:
    s = summary(report)
    assert s["processes"]["alive_after"] == []
    assert alive(started_pids(report), t_end) == []
    return s


def assert_no_bare_traceback(stderr: str) -> None:
    assert not re.search(r"^Traceback", stderr, re.M), stderr  # a worker's traceback is shown indented


def test_builder_raising_names_the_worker_and_its_row(tmp_path):
    """Its length (53 s beside two CPU hogs): a 2 x 2 launch (its forkserver imports torch and torchrl) up to the
    builders' failure, then its teardown."""
    spec = write(tmp_path / "raise.yaml", user_spec("faulty:raising", 2, 2, fault_seed=2))
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet")
    t_end = time.time()
    assert result.returncode == 1, result.stderr
    err = result.stderr
    assert "env worker failed during construction: RuntimeError: planted failure in the worker with seed 2" in err
    assert "at subcollector 1, worker 0" in err
    assert "plan row: global_index=2" in err and "seed=2" in err
    assert 'faulty.py", line' in err  # the worker's own traceback
    assert_no_bare_traceback(err)
    s = assert_torn_down(report, t_end)
    assert s["exit_code"] == 1 and (s["error"]["subcollector"], s["error"]["worker"]) == (1, 0)


def test_worker_exiting_without_traceback(tmp_path):
    """A worker that exits during construction, saying nothing: exit 1 naming its row, nothing left. Its length
    (up to 30 s beside two CPU hogs): a launch and its teardown, and, as its test process's first command, the start
    of the server its commands fork from (tests/preimported.py: an import of torch and torchrl)."""
    spec = write(tmp_path / "exit.yaml", user_spec("faulty:exiting", 1, 2, fault_seed=1))
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet")
    t_end = time.time()
    assert result.returncode == 1, result.stderr
    assert "env worker died during construction without a traceback" in result.stderr
    assert "at subcollector 0, worker 1" in result.stderr
    assert_no_bare_traceback(result.stderr)
    assert_torn_down(report, t_end)


def test_the_startup_deadline_ends_the_launch_wherever_it_falls(tmp_path):
    """A deadline at a random instant of the startup (the subcollector still starting, the hung worker not started
    or constructing, whichever the machine's speed gives): exit 1, each worker not ready named as the deadline found
    it, nothing left."""
    deadline = round(random.uniform(1.0, 12.0), 1)
    spec = write(tmp_path / "hang.yaml", user_spec("faulty:hanging", 1, 2, fault_seed=1))
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet", "--startup-timeout", deadline)
    t_end = time.time()
    assert result.returncode == 1, (deadline, result.stderr)
    assert re.search(rf"startup deadline of {deadline:g}s passed: [12] of 2 env workers not ready: ", result.stderr), \
        (deadline, result.stderr)
    assert re.search(r"sub0/w1 (not started|constructing for [\d.]+s \(pid \d+\))", result.stderr), (deadline, result.stderr)
    assert_no_bare_traceback(result.stderr)
    s = assert_torn_down(report, t_end)
    assert s["launch"]["startup_timeout_s"] == deadline


@pytest.fixture
def started(tmp_path):
    """``started(spec, *args)`` starts ``topo launch`` in the background; whatever still runs at the end of
    the test (it failed before its launch ended) is killed, its watcher ending the rest."""
    procs = []

    def start(spec: dict, *args):
        proc, report = _start(tmp_path, spec, *args)
        procs.append(proc)
        return proc, report

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _start(tmp_path, spec: dict, *args) -> tuple[subprocess.Popen, object]:
    report = tmp_path / "report"
    # SIGINT as a terminal gives it, even when the tests run in a background job (which ignores it)
    proc = preimported.popen(command(write(tmp_path / "spec.yaml", spec), "--report", report, "--quiet", *args),
                             env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=preimported.default_sigint)
    return proc, report


def _markers(report, name: str) -> list[dict]:
    try:
        return [m for m in records(report, "markers") if m["name"] == name]
    except ValueError:  # no run directory yet
        return []


def _collecting(report) -> bool:
    """A subcollector has delivered a batch."""
    try:
        return bool(records(report, "observed"))
    except ValueError:
        return False


@pytest.mark.parametrize("signum,deaf", [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGTERM, True)],
                         ids=["SIGINT", "SIGTERM", "SIGTERM-workers-deaf-to-it"])
def test_signal_during_startup(started, signum, deaf):
    """Both workers hang while constructing; deaf to SIGTERM, they are SIGKILLed once its share of the teardown
    passed."""
    proc, report = started(user_spec("faulty:hanging", 1, 2, ignore_sigterm=deaf))
    wait_for(lambda: len(_markers(report, "started")) == 2, what="both workers constructing")
    hung = {m["pid"] for m in _markers(report, "started")}
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    t_end = time.time()
    assert proc.returncode == 128 + signum, err
    assert f"interrupted by {signal.Signals(signum).name}" in err
    assert_no_bare_traceback(err)
    s = assert_torn_down(report, t_end)
    assert (hung <= set(s["processes"]["killed"])) == deaf, (hung, s["processes"])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_collection_closes_every_env(started, signum):
    """Its length (42-51 s beside two CPU hogs): a 2 x 2 launch up to its first batch, then the teardown the signal
    starts, every env closed."""
    proc, report = started(toy_spec(2, 2), "--batches", str(10**9))
    wait_for(lambda: _collecting(report), what="the first batch")
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    t_end = time.time()
    assert proc.returncode == 128 + signum, err
    assert_no_bare_traceback(err)
    s = assert_torn_down(report, t_end)
    assert s["env_closes"] == {"constructed": 4, "closed": 4}  # the collector shut down gracefully
    assert s["processes"]["left_behind"] == []


@pytest.mark.parametrize("mode", ["multi", "async"])
def test_a_worker_stopped_when_the_run_ends_is_killed_first_and_jams_nothing(started, mode):
    """An env worker SIGSTOPped at a random instant of collection, then SIGINT: the stopped worker is SIGKILLed
    before the graceful close (it would close nothing, and a close waiting on it spent the whole budget: 26 s
    of 30 in multi mode, and async mode never ended); nothing is left."""
    spec = toy_spec(1, 2, collector={"mode": mode, "frames_per_batch": 8})
    if mode == "async":
        spec["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16,
                                                                             "state_dim": 8}}
    spec["launch"]["shutdown_timeout"] = 30
    proc, report = started(spec, "--batches", str(10**9))
    wait_for(lambda: _collecting(report), what="the first batch")
    (pid,) = [m["pid"] for m in _markers(report, "started") if m["worker"]["index"] == 1]
    time.sleep(random.uniform(0.0, 2.0))
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=HANG_GUARD_S)
    t_end = time.time()
    assert proc.returncode == 128 + signal.SIGINT, err
    assert_no_bare_traceback(err)
    s = assert_torn_down(report, t_end)
    assert pid in s["processes"]["killed"], s["processes"]


@pytest.mark.parametrize("placement", ["subcollector", "server"])
def test_a_policy_factory_that_raises_is_named(tmp_path, placement):
    policy = {"factory": "faulty:failing_policy", "placement": placement}  # 1 x 2: the message names no subcollector
    spec = write(tmp_path / "spec.yaml", toy_spec(1, 2, policy=policy))
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet")
    t_end = time.time()
    assert result.returncode == 1, result.stderr
    where = "the policy server" if placement == "server" else "subcollector"
    assert f"policy factory failed in {where}" in result.stderr
    assert "RuntimeError: planted failure in the policy factory" in result.stderr
    assert 'faulty.py", line' in result.stderr  # the factory's own traceback
    assert_no_bare_traceback(result.stderr)
    s = assert_torn_down(report, t_end)
    assert s["error"]["failure"]["kind"] == "policy-failed"


def test_a_policy_that_is_not_a_tensordict_module_is_refused(tmp_path):
    spec = write(tmp_path / "spec.yaml", toy_spec(1, 2, policy={"factory": "faulty:plain_module"}))
    result = launch(spec, "--report", tmp_path / "report", "--quiet")
    assert result.returncode == 1, result.stderr
    assert "the policy factory returned a Linear, not a TensorDictModuleBase" in result.stderr
    assert_no_bare_traceback(result.stderr)
