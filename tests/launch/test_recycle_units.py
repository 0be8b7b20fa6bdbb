"""Health budgets without a topology: what a worker's slot holds of its steps and resets, the pure verdict
(which worker, which budget), the recycle it decides (restart rows, no restart budget spent), its report."""
from __future__ import annotations

import os

import pytest

from topo.runtime import heartbeat
from topo.launch.supervision import recycle
from topo.launch import report
from topo.launch.supervision.recycle import Breach, Budgets
from topo.launch.supervision.state import RunState
from topo.compiler.render import recycle_text
from topo.runtime.rundir import RunDir

from tests.launch.test_launch_units import PLAN
from tests.launch.test_recovery_units import PLAN_WITH_KWARGS, SteppedEnv, beats_with_memory

GB = 2**30


def health(rss_gb=0.5, steps=100, latency=0.01, baseline=0.01, resets=1, pid=7) -> heartbeat.Health:
    return heartbeat.Health(pid, round(rss_gb * GB), steps, latency, baseline, resets)


# -- what a worker's slot holds -------------------------------------------------------------------

def test_a_worker_slot_holds_its_step_count_baseline_weighted_mean_and_resets(tmp_path, monkeypatch):
    run, _ = beats_with_memory(tmp_path, monkeypatch, [(100 * 2**20, 100 * 2**20)])
    clock = [1000.0]
    monkeypatch.setattr(heartbeat, "time", type("Clock", (), {"time": staticmethod(lambda: clock[0])}))
    env = SteppedEnv()
    step = env._step

    def timed(seconds):
        def _step(td):
            clock[0] += seconds
            return step(td)
        return _step

    env._step = timed(1.0)
    heartbeat.watch(env, run, {"subcollector": 1, "index": 1})
    assert heartbeat.health(str(tmp_path), 1, 0)[0] is None  # worker 0: its env not built
    built = heartbeat.health(str(tmp_path), 1, 0)[1]
    assert (built.steps, built.baseline, built.resets, built.drift) == (0, None, 0, None)
    env._reset("td")
    for _ in range(heartbeat.BASELINE_STEPS - 1):
        env._step("td")
    early = heartbeat.health(str(tmp_path), 1, 0)[1]
    assert (early.steps, early.latency, early.baseline, early.resets) == (49, 1.0, None, 1)  # no baseline yet
    env._step("td")
    assert heartbeat.health(str(tmp_path), 1, 0)[1].drift == 1.0  # the baseline: the mean of the first 50 steps


def test_the_weighted_mean_follows_a_slowdown_and_clips_a_single_stall(tmp_path, monkeypatch):
    run, _ = beats_with_memory(tmp_path, monkeypatch, [(100 * 2**20, 100 * 2**20)])
    clock = [1000.0]
    monkeypatch.setattr(heartbeat, "time", type("Clock", (), {"time": staticmethod(lambda: clock[0])}))
    durations = [1.0] * 50 + [100.0] + [2.0] * 100
    env = SteppedEnv()
    step = env._step

    def _step(td):
        clock[0] += durations.pop(0)
        return step(td)

    env._step = _step
    heartbeat.watch(env, run, {"subcollector": 1, "index": 0})
    env._step("td")
    for _ in range(49):
        env._step("td")
    env._step("td")  # a 100 s stall counts as 4 x the mean
    stalled = heartbeat.health(str(tmp_path), 1, 0)[0]
    assert stalled.drift == pytest.approx(1 + heartbeat.EWMA_ALPHA * 3)
    for _ in range(100):
        env._step("td")
    slowed = heartbeat.health(str(tmp_path), 1, 0)[0]
    expected = 2.0 + (1 + heartbeat.EWMA_ALPHA * 3 - 2.0) * (1 - heartbeat.EWMA_ALPHA) ** 100
    assert slowed.steps == 151 and slowed.drift == pytest.approx(expected) and slowed.drift > 1.99
    assert slowed.rss == 100 * 2**20 and slowed.pid == os.getpid()


# -- the verdict ----------------------------------------------------------------------------------

def test_the_first_worker_past_a_budget_is_named_with_its_value_and_the_limit():
    budgets = Budgets(max_rss_gb=1.5, max_latency_drift=2.0, max_episodes=20)
    assert recycle.breach([health(), health(rss_gb=1.4, latency=0.019, resets=20)], budgets) is None  # at the limits
    found = recycle.breach([health(), health(rss_gb=1.875, latency=0.03, resets=30, pid=9)], budgets)
    assert found == Breach("max_rss_gb", 1, 1.875, 1.5, 9)  # memory first
    assert found.describe() == "rss 1.88 GB > max_rss_gb 1.5"
    drift = recycle.breach([None, health(latency=0.025), health(rss_gb=2)], budgets)
    assert (drift.budget, drift.worker, drift.value) == ("max_latency_drift", 1, pytest.approx(2.5))
    assert drift.describe() == "latency drift 2.50 > max_latency_drift 2"
    episodes = recycle.breach([health(resets=22)], budgets)
    assert episodes.to_dict() == {"budget": "max_episodes", "worker": 0, "value": 22, "limit": 20, "pid": 7}
    assert episodes.describe() == "episodes begun 22 > max_episodes 20"


def test_a_budget_not_set_or_a_figure_not_read_yet_is_never_past():
    assert recycle.breach([health(rss_gb=100, latency=100, resets=10**6)], Budgets()) is None
    unread = heartbeat.Health(0, 0, 10, 5.0, None, 0)  # no memory read, no baseline, no reset yet
    assert recycle.breach([unread], Budgets(max_rss_gb=0.001, max_latency_drift=1.01, max_episodes=1)) is None


# -- the recycle ----------------------------------------------------------------------------------

def beats(run_dir: str, c: int, restart: int, workers: list[heartbeat.Health | None]) -> None:
    """A subcollector's beats file holding ``workers``' figures."""
    os.makedirs(os.path.join(run_dir, "beats"), exist_ok=True)
    slots = [heartbeat.SLOT.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    for h in workers:
        slots.append(heartbeat.SLOT.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0) if h is None else heartbeat.SLOT.pack(
            1.0, 2.0, 2.0, h.pid, h.rss, h.rss, h.steps, h.latency, h.baseline or 0.0, h.resets))
    with open(heartbeat.path(run_dir, c, restart), "wb") as f:
        f.write(b"".join(slot.ljust(heartbeat.STRIDE, b"\0") for slot in slots))  # no call timed yet


class Lock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_subcollector_past_a_budget_is_recycled_with_restart_rows_every_check_every_batches(tmp_path):
    plan = {**PLAN_WITH_KWARGS, "launch": {**PLAN["launch"], "recycle": {"max_rss_gb": 1.0, "max_latency_drift": None,
                                                             "max_episodes": 5, "check_every": 2}}}
    state = RunState(plan, RunDir(str(tmp_path)), started=100.0, trainer_pid=1)
    beats(str(tmp_path), 0, 0, [health(), health()])
    beats(str(tmp_path), 1, 0, [health(resets=3), health(rss_gb=1.25, resets=6)])
    recycler = recycle.Recycler(state, Lock())
    assert recycler.between_batches(200.0) == []  # batch 1 of 2: not checked
    (decided,) = recycler.between_batches(201.0)
    assert (decided.subcollector, decided.restart, decided.breach.budget, decided.breach.worker) == (
        1, 1, "max_rss_gb", 1)
    assert decided.row == PLAN_WITH_KWARGS["subcollectors"][1]["workers"][1] and decided.decided_at == 201.0
    sub = state.subcollectors[1]
    assert (sub.restart, sub.pending) == (1, True) and state.restarts == [] and state.recycles == [decided]
    assert [state.workers[(1, w)].row["seed"] for w in (0, 1)] == [2 + 4, 3 + 4]  # restart 1's seeds (4 workers)
    assert [w.restart for w in state.retired_workers] == [0, 0]
    assert recycler.between_batches(202.0) == []
    assert recycler.between_batches(203.0) == []  # pending (and then not ready): not read again
    sub.pending, sub.ready = False, 210.0
    beats(str(tmp_path), 1, 1, [health(), health()])
    assert recycler.between_batches(204.0) == [] and recycler.between_batches(205.0) == []  # healthy again

    section = report.recycles(state)
    (entry,) = section
    assert (entry["subcollector"], entry["restart"], entry["outcome"], entry["reason"]) == (
        1, 1, "pending", "rss 1.25 GB > max_rss_gb 1")
    assert entry["row"] == {k: v for k, v in PLAN["subcollectors"][1]["workers"][1].items() if k != "kwargs"}
    assert entry["decided_s"] == 101.0 and entry["rebuild_s"] is None
    assert entry["seeds"] == {"planned": [6, 7], "applied": [None, None]}
    decided.ready_at = 207.25
    line = report.recycle_line(report.recycles(state)[0])
    assert line == ("  recycled subcollector 1 (worker 1, plan row global_index 3 seed 3: rss 1.25 GB > max_rss_gb 1) "
                    "in 6.2 s; pids None [None, None], seeds [None, None]")


def test_no_recycle_section_checks_nothing(tmp_path):
    state = RunState(PLAN, RunDir(str(tmp_path)), started=100.0, trainer_pid=1)
    beats(str(tmp_path), 0, 0, [health(rss_gb=1000), health()])
    recycler = recycle.Recycler(state, Lock())
    assert [recycler.between_batches(200.0 + i) for i in range(3)] == [[], [], []] and state.recycles == []


def test_the_dry_run_line_names_every_budget_set():
    assert recycle_text({"max_rss_gb": 1.5, "max_latency_drift": 2, "max_episodes": None, "check_every": 1}) == (
        "recycle a subcollector when a worker's rss > 1.5 GB or step latency > 2 x its baseline "
        "(checked every batch; restart seeds)")
    assert recycle_text({"max_rss_gb": None, "max_latency_drift": None, "max_episodes": 200, "check_every": 10}) == (
        "recycle a subcollector when a worker's episodes > 200 (checked every 10 batches; restart seeds)")


def test_recycling_needs_what_restarts_need_of_torchrl():
    """A torchrl without the names a restart uses drops recycling too (with the restarts warning)."""
    from topo.launch import boundary

    plan = {"launch": {"recycle": {"max_rss_gb": 1.0, "max_latency_drift": None, "max_episodes": None,
                                   "check_every": 1}}, "subcollectors": []}
    assert "restarts" in boundary.features_of(plan, None)
    assert "restarts" not in boundary.features_of({**plan, "launch": {"recycle": None}}, None)
