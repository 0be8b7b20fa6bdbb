"""The stall watchdog on real torchrl (toy env, real processes): a run whose workers all stop stepping is
named once it passed launch.stall_timeout, ended (on_stall: fail) with its report and nothing left; a run with
one worker 10x slower than the others is not."""
from __future__ import annotations

import time

import pytest

from topo.runtime import events
from topo.runtime.rundir import RunDir

from tests.launch.launch_helpers import alive, launch, run_dir, started_pids, summary, user_spec, write

pytestmark = pytest.mark.slow
TIMEOUT_S = 3


def stalling_spec(factory: str, **kwargs) -> dict:
    spec = user_spec(factory, 2, 2, **kwargs)
    spec["collector"] = {"frames_per_batch": 8}  # two steps of each worker per batch
    spec["launch"].update(stall_timeout=TIMEOUT_S, on_stall="fail", shutdown_timeout=15)
    return spec


def test_a_run_whose_workers_all_stop_stepping_is_named_and_ended(tmp_path):
    """Every worker stops stepping after 4 steps: the watchdog names the stall 3 s after the last batch and the run
    ends with exit 1. About 30 s on a slow day (30.5 s with the import reference at 7-8 s): a launch, the stall
    timeout, then the teardown of four workers that answer no step."""
    spec = write(tmp_path / "stop.yaml", stalling_spec("faulty:stopping_step", after_steps=4))
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet", "--batches", 1000)
    t_end = time.time()
    assert result.returncode == 1, result.stderr
    assert "the run stalled: no batch for" in result.stderr and "launch.stall_timeout 3s" in result.stderr
    assert "subcollectors 0, 1 delivered nothing" in result.stderr
    s = summary(report)
    assert s["exit_code"] == 1 and "the run stalled" in s["error"]["message"]
    (stall,) = [e for e in events.read(RunDir(str(run_dir(report)))) if e["name"] == "stall"]
    assert stall["fail"] is True and stall["silent_subcollectors"] == [0, 1]
    assert sorted((w["subcollector"], w["worker"]) for w in stall["idle_workers"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # never early (the record rounds to the millisecond: a stall found 0.2 ms past its timeout reads 3.0); named
    # once, as what ended the run (else the launch runs on into the test's guard); the workers fell silent first:
    # each one's last step ended before the last batch came out, however long a loaded machine took to notice
    assert TIMEOUT_S <= stall["seconds"] <= min(w["idle_s"] for w in stall["idle_workers"])
    assert s["processes"]["alive_after"] == [] and alive(started_pids(report), t_end) == []


def test_a_worker_ten_times_slower_is_not_a_stall(tmp_path):
    """Each step takes 0.05 s, worker 3's 0.5 s: the batches come every ~1 s, within the 3 s timeout."""
    spec = write(tmp_path / "slow.yaml", stalling_spec("faulty:slow_step", fault_seed=3, step_s=0.05, slowdown=10))
    report = tmp_path / "report"
    result = launch(spec, "--report", report, "--quiet", "--batches", 8)
    assert result.returncode == 0, result.stderr
    assert "stalled" not in result.stderr
    assert summary(report)["ok"]
    assert [e for e in events.read(RunDir(str(run_dir(report)))) if e["name"] == "stall"] == []
