"""Restarts and hangs without a topology: the seed rule, the budget, the monitor's verdict, blame that
ignores what a retired subcollector did, hangs read from fabricated heartbeats, and the beats file."""
from __future__ import annotations

import json
import os
import select
import threading
import time

from topo.runtime import heartbeat
from topo.launch.supervision import failure, lives, restarts
from topo.launch.supervision.monitor import Monitor
from topo.launch.supervision.processes import Death
from topo.launch.supervision.progress import Progress
from topo.launch.supervision.state import Phase, RunState
from topo.runtime.rundir import HOST, RESTART_VAR, RunDir

from tests.launch.test_launch_units import PLAN, started, sub


def state_of(tmp_path, *markers: dict, plan: dict | None = None) -> RunState:
    plan = plan or PLAN
    run = RunDir(str(tmp_path))
    state = RunState(plan, run, started=100.0, trainer_pid=1)
    add(state, *markers)
    return state


def add(state: RunState, *markers: dict) -> None:
    where = state.run.path + "/markers"
    os.makedirs(where, exist_ok=True)
    for m in markers:
        with open(f"{where}/{m['name']}.{m['pid']}.{m['time']}.json", "w") as f:
            json.dump({"host": HOST, "ppid": 1, **m}, f)
    state.update()


def constructed(c: int, w: int, pid: int, t: float, seed: int, restart: int = 0) -> dict:
    return {"name": "constructed", "pid": pid, "time": t, "seed": seed, "seconds": 0.1, "restart": restart,
            "worker": {"subcollector": c, "index": w}}


# -- seeds ----------------------------------------------------------------------------------------

def test_a_restart_changes_the_seed_only_by_a_documented_stride():
    assert lives.restart_seed(3, 1, 4) == 7 and lives.restart_seed(3, 2, 4) == 11
    assert lives.restart_seed(None, 1, 4) is None
    assert lives.restart_seed(2**63 - 2, 1, 4) == 2  # 63-bit seeds wrap
    rows = lives.restart_rows(PLAN_WITH_KWARGS, 1, 2)
    assert [r["seed"] for r in rows] == [2 + 8, 3 + 8]
    assert [r["kwargs"]["seed"] for r in rows] == [10, 11]
    assert rows[0]["kwargs"]["env"] == {"factory": "m:f", "kwargs": {"seed": 10, "instruction": "a"}}  # a user factory's
    original = PLAN_WITH_KWARGS["subcollectors"][1]["workers"][0]
    assert {k: v for k, v in rows[0].items() if k not in ("seed", "kwargs")} == \
        {k: v for k, v in original.items() if k not in ("seed", "kwargs")}  # the plan row otherwise, exactly
    assert original["seed"] == 2 and original["kwargs"]["seed"] == 2  # the plan itself is untouched


PLAN_WITH_KWARGS = {**PLAN, "subcollectors": [
    {**s, "workers": [{**r, "kwargs": {"builder": "topo.envs.user:build", "seed": r["seed"],
                                       "env": {"factory": "m:f", "kwargs": {"seed": r["seed"], "instruction": "a"}}}}
                      for r in s["workers"]]} for s in PLAN["subcollectors"]]}


# -- the budget and the verdict -------------------------------------------------------------------

def test_the_budget_counts_restarts_within_its_window():
    budget = restarts.Budget({"max": 2, "window": 10})
    assert budget.allows(100)
    budget.spend(100)
    budget.spend(105)
    assert not budget.allows(109) and budget.allows(110.5)
    assert budget.describe() == "the restart budget is spent (launch.restarts: 2 within 10s)"
    assert restarts.Budget(None).describe() == "restarts are off (launch.restarts)"
    forever = restarts.Budget({"max": 1, "window": None})
    forever.spend(0)
    assert not forever.allows(10**9)


def monitor_of(state: RunState, restarts: dict | None) -> tuple[Monitor, list]:
    state.plan = {**state.plan, "launch": {**state.plan["launch"], "restarts": restarts}}
    failed = []
    return Monitor(state, 60, Progress(False), failed.append), failed


def test_while_collecting_a_worker_death_restarts_its_subcollector_and_only_its_successor_is_watched(tmp_path):
    state = state_of(tmp_path, sub(0, 10, 101), sub(1, 11, 101), started(1, 0, 20, 102), started(1, 1, 21, 102),
                     constructed(1, 1, 21, 103, seed=3), plan=PLAN_WITH_KWARGS)
    state.phase = Phase.COLLECTING
    monitor, failed = monitor_of(state, {"max": 1, "window": None})
    state.record_death(Death(21, 110.0, "killed by SIGKILL"))
    monitor.judge(failure.decide(state))
    assert failed == [] and monitor.failure is None
    (r,) = state.restarts
    assert (r.subcollector, r.restart, r.cause.kind, r.cause.worker) == (1, 1, "worker-died", 1)
    new = state.subcollectors[1]
    assert (new.restart, new.pending, new.pid) == (1, True, None)
    assert [w.row["seed"] for w in state.workers.values() if w.subcollector == 1] == [6, 7]  # 2, 3 + 4 workers
    # what the retired start does next causes nothing: its subcollector's exit, a late close
    state.record_death(Death(11, 111.0, "exit code 0"))
    add(state, {"name": "closed", "pid": 20, "time": 111.5, "seconds": 0.1, "worker": {"subcollector": 1, "index": 0}})
    assert failure.decide(state) is None
    assert state.worker(1, 0, 0).closed == 111.5 and state.worker(1, 0, 1).closed is None
    assert state.subcollector(1, 0).died.how == "exit code 0"
    # the restart's own processes are its successor's: its builder failing is a new failure, in restart 1
    add(state, {"name": "subcollector", "pid": 12, "time": 112, "index": 1, "start_method": "spawn", "restart": 1},
        {"name": "failed", "pid": 22, "time": 113, "traceback": "T\nValueError: x", "restart": 1,
         "worker": {"subcollector": 1, "index": 0}})
    found = failure.decide(state)
    assert (found.kind, found.restart, found.row["seed"]) == ("builder-raised", 1, 6)
    assert found.message == "env worker failed during construction (restart 1): ValueError: x"
    monitor.judge(found)  # the budget (1) is spent: the run fails, saying so
    assert failed == [monitor.failure] and monitor.failure.message.endswith(
        "; the restart budget is spent (launch.restarts: 1)")
    assert [r.superseded for r in state.restarts] == [False]


def test_without_a_budget_or_outside_collection_a_failure_is_the_runs(tmp_path):
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102))
    state.record_death(Death(20, 105.0, "exit code 3"))
    monitor, failed = monitor_of(state, {"max": 5, "window": None})
    monitor.judge(failure.decide(state))  # still starting: a startup failure ends the run
    assert failed and failed[0].kind == "worker-died" and state.restarts == []
    state = state_of(tmp_path / "b", sub(0, 10, 101), started(0, 0, 20, 102))
    state.phase = Phase.COLLECTING
    monitor, failed = monitor_of(state, None)
    state.record_death(Death(20, 105.0, "exit code 3"))
    monitor.judge(failure.decide(state))
    assert failed[0].message.endswith("; restarts are off (launch.restarts)")


def test_a_server_death_is_never_restarted(tmp_path):
    state = state_of(tmp_path, {"name": "server", "pid": 30, "time": 101, "role": "server", "in_keys": [],
                                "out_keys": []})
    state.phase = Phase.COLLECTING
    monitor, failed = monitor_of(state, {"max": 5, "window": None})
    state.record_death(Death(30, 102.0, "killed by SIGKILL"))
    found = failure.decide(state)
    assert not found.restartable
    monitor.judge(found)
    assert failed == [found] and state.restarts == []


# -- hangs ----------------------------------------------------------------------------------------

def test_a_step_past_the_deadline_is_a_worker_hang_named_with_its_row(tmp_path):
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    beats = {0: [(200.0, 190.0), (198.0, 199.5), (195.0, 194.0)]}  # worker 1 in a step since 195
    found = failure.hung(state, beats, timeout=10, now=206.0)
    assert (found.kind, found.subcollector, found.worker, found.pid, found.at) == ("worker-hung", 0, 1, 21, 205.0)
    assert found.message == ("env worker hung while collecting: its step has not returned for 11.0s (hang_timeout 10s, "
                             "pid 21); it last finished a step 12.0s ago")
    assert found.row == PLAN["subcollectors"][0]["workers"][1] and found.restartable
    assert failure.hung(state, beats, timeout=10, now=204.0) is None  # not yet


def test_a_subcollector_owing_a_batch_without_any_step_is_a_subcollector_hang(tmp_path):
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    owes = [(200.0, 150.0), (180.0, 181.0), (180.0, 182.0)]  # asked at 200, no step since 182
    found = failure.hung(state, {0: owes}, timeout=10, now=211.0)
    assert (found.kind, found.subcollector, found.worker, found.pid, found.at) == ("subcollector-hung", 0, None, 10, 210.0)
    assert found.message.startswith("subcollector stopped answering while collecting: no env step for 11.0s")
    delivered = [(200.0, 201.0), (180.0, 181.0), (180.0, 182.0)]  # its batch is out: idle, not hung
    assert failure.hung(state, {0: delivered}, timeout=10, now=500.0) is None


def test_a_worker_stopped_before_its_step_is_the_hang_its_subcollector_waits_on(tmp_path):
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    owes = [(200.0, 150.0), (180.0, 199.0), (180.0, 198.9)]  # asked at 200; worker 1 never took step 8
    found = failure.hung(state, {0: owes}, timeout=10, now=211.0, steps={0: [8, 7]})
    assert (found.kind, found.subcollector, found.worker, found.pid, found.at) == ("worker-hung", 0, 1, 21, 210.0)
    assert found.message == ("env worker hung while collecting: its subcollector has waited 11.0s for its step "
                             "(hang_timeout 10s, pid 21); it took 7 steps, its siblings 8")
    assert failure.hung(state, {0: owes}, timeout=10, now=211.0, steps={0: [8, 8]}).kind == "subcollector-hung"


def test_a_stopped_worker_is_the_hang_of_a_subcollector_that_waits_on_none_by_its_heartbeats(tmp_path):
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    owes = [(200.0, 150.0), (180.0, 199.0), (180.0, 199.1)]  # both took their step; worker 1 stopped before saying so
    hung = failure.hung(state, {0: owes}, timeout=10, now=211.0, steps={0: [8, 8]})
    found = failure.stopped_in(state, hung, lambda pid: pid == 21)
    assert (found.kind, found.subcollector, found.worker, found.pid, found.at) == ("worker-hung", 0, 1, 21, hung.at)
    assert found.message.startswith("env worker stopped while collecting (pid 21): its subcollector waits for it (no env step")
    assert failure.stopped_in(state, hung, lambda pid: False) is None


def test_an_async_worker_that_has_not_stepped_since_the_trainer_asked_hangs_alone(tmp_path):
    """Async mode: each worker steps on its own; while the trainer waits for a batch, one idle for the timeout hangs,
    whatever its siblings' counts, the trainer's last hold of a batch left out; while it holds one, none does."""
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    owes = [(200.0, 197.0), (209.0, 209.5), (180.0, 196.0)]  # held 197-200; worker 1 idle since 196, worker 0 steps
    found = failure.hung(state, {0: owes}, timeout=10, now=210.0, steps={0: [90, 95]}, independent=True)
    assert (found.kind, found.subcollector, found.worker, found.pid, found.at) == ("worker-hung", 0, 1, 21, 209.0)
    assert found.message == ("env worker hung while collecting: no step for 11.0s while the trainer waited for a batch "
                             "(hang_timeout 10s, pid 21); it took 95 steps")
    assert failure.hung(state, {0: owes}, timeout=10, now=208.0, steps={0: [90, 95]}, independent=True) is None
    asked_often = [(209.9, 209.8), (209.7, 209.8), (180.0, 196.0)]  # batches every 0.1 s: idle since 196 all the same
    assert failure.hung(state, {0: asked_often}, timeout=10, now=210.0, independent=True).worker == 1
    stalled = [(200.0, 199.9), (180.0, 199.5), (180.0, 198.0)]  # asked at 200; no worker stepped since
    assert failure.hung(state, {0: stalled}, timeout=10, now=211.0, independent=True) is None  # the stall watch's
    found = failure.hung(state, {0: stalled}, timeout=10, now=211.0, independent=True, is_stopped=lambda pid: pid == 21)
    assert (found.worker, found.pid) == (1, 21) and found.message.startswith("env worker stopped while collecting")
    idle = [(200.0, 199.9), (180.0, 195.0), (180.0, 198.0)]  # worker 0 idle since 195, worker 1 (stopped) since 198
    restarted = [(200.0, 199.9), (210.5, 210.6), (210.4, 210.45)]  # another subcollector's new workers: first resets
    assert failure.hung(state, {0: idle, 1: restarted}, timeout=10, now=211.0, independent=True).pid == 20
    found = failure.hung(state, {0: idle, 1: restarted}, timeout=10, now=211.0, independent=True,
                         is_stopped=lambda pid: pid == 21)
    assert found.pid == 21  # the stopped one, not an idle one the stall it caused left behind
    held = [(200.0, 201.0), (180.0, 182.0), (180.0, 181.0)]  # the trainer has its batch: workers may wait on permits
    assert failure.hung(state, {0: held}, timeout=10, now=500.0, independent=True) is None
    in_step = [(200.0, 150.0), (205.0, 209.5), (199.0, 198.0)]  # worker 1 in a step since 199: the step rule first
    found = failure.hung(state, {0: in_step}, timeout=10, now=211.0, independent=True)
    assert (found.worker, found.at) == (1, 209.0) and "its step has not returned for 12.0s" in found.message


def test_beats_file_roundtrip_and_stamped_steps(tmp_path, monkeypatch):
    monkeypatch.setenv(RESTART_VAR, "2")
    run = RunDir(str(tmp_path))
    heartbeat.open_subcollector(run, 1, workers=2)
    assert heartbeat.read(str(tmp_path), 1, 2) == [(0.0, 0.0)] * 3
    assert heartbeat.read(str(tmp_path), 1, 0) is None  # another start's file: not there

    class Env:
        def __init__(self):
            self.inside = []

        def _step(self, td):
            self.inside.append(heartbeat.read(str(tmp_path), 1, 2)[2])
            return td

        def _reset(self, td):
            return td

    env = Env()
    before = time.time()
    heartbeat.watch(env, run, {"subcollector": 1, "index": 1})
    assert env._step("td") == "td"
    (during,) = env.inside
    started_, ended = heartbeat.read(str(tmp_path), 1, 2)[2]
    assert during[0] > during[1] >= before  # busy inside the step
    assert ended >= started_ == during[0]  # idle after it
    heartbeat.collecting()
    assert heartbeat.read(str(tmp_path), 1, 2)[0][0] >= before
    heartbeat.delivered()
    slot = heartbeat.read(str(tmp_path), 1, 2)[0]
    assert slot[1] >= slot[0]


# -- memory per worker -----------------------------------------------------------------------------

def test_resident_memory_is_read_from_proc_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 900000 kB\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t4\n")
    assert heartbeat.resident(str(status)) == (100 * 2**20, 200 * 2**20)  # (VmRSS, VmHWM), not VmPeak (virtual)
    status.write_text("Name:\tpython\nVmRSS:\t 1 kB\n")  # a kernel thread shows no VmHWM
    assert heartbeat.resident(str(status)) is None
    assert heartbeat.resident(str(tmp_path / "missing")) is None  # no /proc: not Linux
    rss, peak = heartbeat.resident()  # this process, for real
    assert 10 * 2**20 < rss <= peak < 64 * 2**30


def beats_with_memory(tmp_path, monkeypatch, readings: list[tuple[int, int]]):
    """A beats file of subcollector 1 (2 workers), seen from a worker process; ``readings`` feed ``resident``."""
    monkeypatch.setattr(heartbeat, "_mine", {})
    run = RunDir(str(tmp_path))
    heartbeat.open_subcollector(run, 1, workers=2)
    monkeypatch.setattr(heartbeat, "_mine", {})  # a worker process: it did not open the file
    calls = []

    def resident():
        calls.append(time.time())
        return readings[min(len(calls), len(readings)) - 1]

    monkeypatch.setattr(heartbeat, "resident", resident)
    return run, calls


class SteppedEnv:
    def __init__(self):
        self.closed = 0

    def _step(self, td):
        return td

    def _reset(self, td):
        return td

    def close(self):
        self.closed += 1


def test_a_worker_stamps_its_memory_when_built_at_most_every_interval_and_at_close(tmp_path, monkeypatch):
    mb = 2**20
    run, calls = beats_with_memory(tmp_path, monkeypatch, [(100 * mb, 150 * mb), (120 * mb, 160 * mb),
                                                           (90 * mb, 200 * mb)])
    assert heartbeat.memory(str(tmp_path), 1, 0) == [None, None]  # nothing read yet
    clock = [1000.0]
    monkeypatch.setattr(heartbeat, "time", type("Clock", (), {"time": staticmethod(lambda: clock[0])}))
    env = SteppedEnv()
    heartbeat.watch(env, run, {"subcollector": 1, "index": 1})
    assert len(calls) == 1  # read once the env is built
    first = heartbeat.memory(str(tmp_path), 1, 0)[1]
    assert (first.pid, first.rss_mb, first.peak_rss_mb, first.at) == (os.getpid(), 100.0, 150.0, 1000.0)
    for _ in range(50):
        clock[0] += heartbeat.MEMORY_EVERY_S / 100  # 50 x 2 stamps in half the interval
        env._step("td")
        env._reset("td")
    assert len(calls) == 1  # every step stamped, memory not read again within the interval
    assert heartbeat.read(str(tmp_path), 1, 0)[2][1] == clock[0]  # the step stamps go on
    clock[0] += heartbeat.MEMORY_EVERY_S * 0.6
    env._step("td")
    assert len(calls) == 2  # the interval is over: read at the end of this step
    env._step("td")
    assert len(calls) == 2
    env.close()
    assert len(calls) == 3 and env.closed == 1  # read at close, whenever it comes, then closed
    last = heartbeat.memory(str(tmp_path), 1, 0)[1]
    assert (last.rss_mb, last.peak_rss_mb) == (90.0, 200.0)  # the latest reading: the worker's lifelong peak
    assert heartbeat.memory(str(tmp_path), 1, 0)[0] is None and heartbeat.memory(str(tmp_path), 2, 0) is None


def test_an_env_its_subcollector_builds_for_itself_stamps_no_memory(tmp_path, monkeypatch):
    run, calls = beats_with_memory(tmp_path, monkeypatch, [(1, 1)])
    monkeypatch.setattr(heartbeat, "_mine", {"pid": os.getpid()})  # the process that opened the beats file
    env = SteppedEnv()
    heartbeat.watch(env, run, {"subcollector": 1, "index": 0})  # a legacy parent env, built with worker 0's row
    env._step("td")
    env.close()
    assert calls == [] and heartbeat.memory(str(tmp_path), 1, 0) == [None, None]
    assert heartbeat.read(str(tmp_path), 1, 0)[1][1] > 0  # its steps are stamped as before


def test_the_run_state_and_the_report_give_each_workers_memory(tmp_path, monkeypatch):
    from topo.launch import report

    mb = 2**20
    run, _ = beats_with_memory(tmp_path, monkeypatch, [(100 * mb, 300 * mb)])
    heartbeat.open_subcollector(run, 0, workers=2)
    monkeypatch.setattr(heartbeat, "_mine", {})
    readings = {(0, 0): (100, 300), (0, 1): (110, 310), (1, 1): (120, 900)}  # sub1/w0 never read its memory
    for (c, w), (rss, peak) in readings.items():
        monkeypatch.setattr(heartbeat, "resident", lambda rss=rss, peak=peak: (rss * mb, peak * mb))
        heartbeat.Stamp(heartbeat.path(str(tmp_path), c, 0), 1 + w, memory=True).end()
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102))
    rows = state.memory()
    assert [(r["subcollector"], r["worker"], r["global_index"], r["peak_rss_mb"]) for r in rows] == [
        (0, 0, 0, 300.0), (0, 1, 1, 310.0), (1, 0, 2, None), (1, 1, 3, 900.0)]
    assert rows[0]["rss_mb"] == 100.0 and rows[0]["pid"] == os.getpid() and rows[2]["pid"] is None
    section = report.memory(rows, state)
    assert section["peak_rss_mb"] == {"min": 300.0, "median": 310.0, "max": 900.0}
    assert (section["measured"], section["workers_total"]) == (3, 4)
    assert section["workers"][0]["at_s"] == round(rows[0]["at"] - state.t0, 3) and "at" not in section["workers"][0]
    line = report.human_memory(section)
    assert line == "  memory per worker, peak RSS: min 300 / median 310 / max 900 MB (3 of 4 worker(s) measured)"
    assert "not measured" in report.human_memory(report.memory([], state))


def test_the_monitor_bell_rings_at_a_verdict(tmp_path):
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), plan=PLAN_WITH_KWARGS)
    state.phase = Phase.COLLECTING
    monitor, _ = monitor_of(state, {"max": 1, "window": None})
    assert select.select([monitor.bell], [], [], 0)[0] == []
    state.record_death(Death(20, 105.0, "exit code 3"))
    threading.Thread(target=monitor.judge, args=(failure.decide(state),)).start()
    assert select.select([monitor.bell], [], [], 5)[0] == [monitor.bell]
    assert os.read(monitor.bell, 8) == b"!"


def test_a_death_seen_while_its_reap_hides_the_status_is_read_again(monkeypatch):
    """Neither the pidfd nor /proc tells, for a moment: the status is read again, not given up."""
    from topo.launch.supervision import processes

    answers = iter([None, None, None, 9])  # the pidfd tells at its fourth reading (9: the wait status of SIGKILL)
    monkeypatch.setattr(processes, "_reaped_status", lambda fd: next(answers))
    monkeypatch.setattr(processes, "_zombie_status", lambda pid: None)
    assert processes.exit_status(1234, pidfd=5) == "killed by SIGKILL"
    monkeypatch.setattr(processes, "_reaped_status", lambda fd: None)
    assert processes.exit_status(1234, pidfd=5) is None  # never told: unknown, after EXIT_STATUS_RETRY_S
    assert processes.exit_status(1234) is None  # no pidfd: /proc was the only chance


def test_a_process_a_peer_s_death_ended_is_never_the_one_blamed(tmp_path):
    """Deaths seen at one instant (a loaded monitor): a subcollector SIGKILLed and the worker its death ended
    (exit 1, its traceback under tracebacks/); then a worker SIGKILLed and the subcollector its death ended."""
    from topo.runtime.rundir import RunDir as Dir

    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    state.phase = Phase.COLLECTING
    os.environ.pop(RESTART_VAR, None)
    pid = os.getpid
    try:
        os.getpid = lambda: 20  # the record's pid: the worker's
        Dir(str(tmp_path)).write("tracebacks", "worker", traceback="EOFError: proc 20 failed")
    finally:
        os.getpid = pid
    state.record_death(Death(20, 105.0, "exit code 1"))
    state.record_death(Death(10, 105.0, "killed by SIGKILL"))
    state.update()
    found = failure.decide(state)
    assert (found.kind, found.pid) == ("subcollector-died", 10)  # not the worker (it ranks first at one instant)

    state = state_of(tmp_path / "b", sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    state.phase = Phase.COLLECTING
    try:
        os.getpid = lambda: 10
        Dir(str(tmp_path / "b")).write("tracebacks", "subcollector", traceback="RuntimeError: At least one process")
    finally:
        os.getpid = pid
    state.record_death(Death(10, 104.0, "exit code 1"))  # seen first
    state.record_death(Death(21, 105.0, "killed by SIGKILL"))
    state.update()
    found = failure.decide(state)
    assert (found.kind, found.pid, found.worker) == ("worker-died", 21, 1)


def test_an_async_worker_idle_while_it_could_send_hangs_though_its_siblings_feed_the_trainer(tmp_path):
    """Async mode: a sibling fills every batch, so the trainer hardly ever waits (its holds cover nearly all the time);
    a worker that has had a result permit for the timeout and took no step hangs all the same. One without a permit
    waits for the trainer (never a hang), and one that just got a permit back counts from then."""
    state = state_of(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102))
    fed = [(209.95, 209.96), (209.9, 209.92), (180.0, 196.0)]  # the trainer has its batch; worker 0 steps, 1 since 196
    assert failure.hung(state, {0: fed}, timeout=10, now=210.0, independent=True) is None  # the owed rule alone: never
    found = failure.hung(state, {0: fed}, timeout=10, now=210.0, independent=True, free={0: [209.0, 197.0]})
    assert (found.kind, found.worker, found.pid, found.at) == ("worker-hung", 1, 21, 207.0)  # the timeout after 197
    assert found.message == ("env worker hung while collecting: no step for 13.0s while its siblings stepped "
                             "(hang_timeout 10s, pid 21); it took 0 steps")
    assert failure.hung(state, {0: fed}, timeout=10, now=210.0, independent=True, free={0: [209.0, None]}) is None
    assert failure.hung(state, {0: fed}, timeout=10, now=210.0, independent=True, free={0: [209.0, 201.0]}) is None
    found = failure.hung(state, {0: fed}, timeout=10, now=210.0, independent=True, free={0: [209.0, 197.0]},
                         is_stopped=lambda pid: pid == 21)
    assert found.message.startswith("env worker stopped while collecting: no step for 13.0s while its siblings stepped")
    quiet = [(209.95, 209.96), (180.0, 190.0), (180.0, 196.0)]  # nobody stepped for the timeout: the stall watch's
    assert failure.hung(state, {0: quiet}, timeout=10, now=210.0, independent=True, free={0: [190.0, 197.0]}) is None
