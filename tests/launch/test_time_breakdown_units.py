"""Where a run's time goes, as pure functions (topo.runtime.time_breakdown) and as the heartbeat records it: no process."""
from __future__ import annotations

import pytest

from topo.runtime import heartbeat
from topo.runtime import time_breakdown as tb
from topo.runtime.rundir import RunDir
from topo.runtime.time_breakdown import Pace, Timed


def timed(*seconds: float) -> Timed:
    histogram = [0] * tb.BUCKETS
    for s in seconds:
        histogram[tb.bucket(s)] += 1
    return Timed(len(seconds), sum(seconds), tuple(histogram))


def test_a_percentile_is_its_bucket_within_a_fifth():
    assert tb.bucket(0) == 0 and tb.bucket(1e-5) == 0 and tb.bucket(1e9) == tb.BUCKETS - 1
    for seconds in (0.0004, 0.003, 0.05, 0.2, 1.7):
        estimate = tb.percentile([1 if i == tb.bucket(seconds) else 0 for i in range(tb.BUCKETS)], 0.5)
        assert seconds / 1.2 < estimate < seconds * 1.2
    durations = [0.010] * 90 + [0.100] * 10
    figures = timed(*durations).figures()
    assert 8 < figures["p50"] < 12 and 80 < figures["p95"] < 120
    assert figures["mean"] == pytest.approx(19.0) and figures["count"] == 100
    assert tb.percentile([0] * tb.BUCKETS, 0.5) is None and Timed().figures() is None


def test_timed_calls_add_up():
    both = timed(0.01, 0.02) + timed(0.04)
    assert both.count == 3 and both.seconds == pytest.approx(0.07) and sum(both.histogram) == 3


def test_the_pace_splits_the_loop_into_collecting_and_training():
    pace = Pace()
    pace.asked(0.0)
    pace.got(1.0)  # collected in 1 s
    pace.asked(4.0)  # the trainer took 3 s
    pace.got(5.0)
    assert pace.figures() == {"batches": 2, "collect_s": 1.0, "between_batches_s": 3.0, "trainer_share": 0.6}
    assert Pace().figures() == {"batches": 0, "collect_s": None, "between_batches_s": None, "trainer_share": None}


def sub(c: int, env: Timed, policy: Timed, workers: int = 2) -> dict:
    return {"subcollector": c, "workers": workers, "env": env, "policy": policy}


QUICK_TRAINER = {"batches": 10, "collect_s": 1.0, "between_batches_s": 0.1, "trainer_share": 0.091}


def test_envs_slower_than_inference_are_env_bound_with_the_figures():
    out = tb.breakdown([sub(0, timed(*[0.05] * 40), timed(*[0.002] * 20)), sub(1, timed(*[0.05] * 40),
                                                                                  timed(*[0.002] * 20))],
                       QUICK_TRAINER, None)
    assert out["verdict"] == "env-bound"
    assert out["line"] == ("env-bound: a subcollector's env worker stepped 1.00 s while it waited 0.04 s for inference; "
                           "trainer 9% of the loop (0.1 s between batches, 1.0 s collecting one)")
    assert out["subcollectors"][0]["env_step_ms"]["count"] == 40 and out["server"] is None


def test_a_slow_server_is_inference_bound_and_its_batch_fill_is_shown():
    stats = {"p50_forward_ms": 30.0, "p95_forward_ms": 41.0, "p50_queue_ms": 2.0, "p95_queue_ms": 5.0,
             "avg_batch_size": 1.5}
    out = tb.breakdown([sub(0, timed(*[0.001] * 10), timed(*[0.04] * 10)), sub(1, timed(*[0.001] * 10),
                                                                                timed(*[0.04] * 10))],
                       QUICK_TRAINER, stats)
    assert out["verdict"] == "inference-bound"
    assert out["server"] == {"forward_ms": {"p50": 30.0, "p95": 41.0}, "queue_ms": {"p50": 2.0, "p95": 5.0},
                             "requests_per_forward": 1.5, "batch_fill": 0.75}
    assert "server forward p50 30.0 ms at 1.5 request(s) per forward (fill 0.75)" in out["line"]


def test_a_trainer_holding_the_loop_is_trainer_bound_whatever_the_envs():
    slow = {"batches": 3, "collect_s": 0.5, "between_batches_s": 2.0, "trainer_share": 0.8}
    out = tb.breakdown([sub(0, timed(0.5), timed(0.001))], slow, None)
    assert out["verdict"] == "trainer-bound"
    assert out["line"] == "trainer-bound: trainer 80% of the loop (2.0 s between batches, 0.5 s collecting one)"


def test_nothing_timed_is_said_so():
    out = tb.breakdown([sub(0, Timed(), Timed())], None, None)
    assert out["verdict"] is None and out["line"] == "not measured: no env step or policy call timed; trainer not timed"
    assert tb.human(out) == [f"  time: {out['line']}", "    sub0: env step not timed; inference wait not timed"]


def test_a_heartbeat_slot_times_steps_and_policy_calls(tmp_path, monkeypatch):
    """A worker's env steps in its slot, the subcollector's policy calls in slot 0, read back as Timed."""
    monkeypatch.setattr(heartbeat, "_mine", {})  # this process plays the subcollector
    run = RunDir(str(tmp_path))
    heartbeat.open_subcollector(run, 0, 2)
    worker = heartbeat.Stamp(heartbeat.path(run.path, 0, 0), 2)
    for _ in range(3):
        worker.start()
        worker.end_step()
    heartbeat.policy_call(0.25)
    heartbeat.policy_call(0.25)
    policy, w0, w1 = heartbeat.timed(run.path, 0, 0)
    assert (policy.count, policy.seconds) == (2, 0.5) and policy.histogram[tb.bucket(0.25)] == 2
    assert (w0.count, w1.count) == (0, 3) and sum(w1.histogram) == 3
    assert heartbeat.health(run.path, 0, 0)[1].steps == 3  # the figures before it are where they were
    assert heartbeat.timed(run.path, 1, 0) is None


def test_an_async_workers_waits_between_its_steps_are_timed_in_its_slot(tmp_path, monkeypatch):
    """A waiting worker times from each end (a step's or a reset's) to its next step's start; its waits, not its
    steps, are what an async subcollector waited for inference, per worker."""
    now = iter([10.0, 10.1, 10.3, 10.4, 10.9, 11.0])  # reset start/end, step, step: waits 0.2 s and 0.5 s
    monkeypatch.setattr(heartbeat.time, "time", lambda: next(now))
    run = RunDir(str(tmp_path))
    heartbeat.create(run.path, 0, 0, 1)
    worker = heartbeat.Stamp(heartbeat.path(run.path, 0, 0), 1)
    worker.waiting = True
    worker.start()
    worker.end_reset()
    for _ in range(2):
        worker.start_step()
        worker.end_step()
    (_, waited) = heartbeat.waits(run.path, 0, 0)
    assert waited.count == 2 and waited.seconds == pytest.approx(0.7)
    assert heartbeat.timed(run.path, 0, 0)[1].count == 2  # its steps, as before
    out = tb.breakdown([{"subcollector": 0, "workers": 2, "env": timed(0.01, 0.01), "policy": timed(0.1, 0.1, 0.1, 0.1),
                         "per_worker": True}], QUICK_TRAINER, None)
    assert out["verdict"] == "inference-bound" and "stepped 0.01 s while it waited 0.20 s" in out["line"]
