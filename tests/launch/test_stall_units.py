"""The stall rule (:func:`topo.runtime.stall.find`) and the monitor's watchdog on fabricated records: no processes."""
from __future__ import annotations

import io

from topo.runtime import events, stall
from topo.launch.supervision.stall_watch import StallWatch
from topo.launch.supervision.state import RunState
from topo.runtime.rundir import RunDir

PLAN = {"launch": {"stall_timeout": 10, "on_stall": "warn"}, "subcollectors": [
    {"index": c, "num_workers": 2, "workers": [
        {"subcollector": c, "index": w, "global_index": 2 * c + w, "task_id": c, "instruction": f"task {c}"}
        for w in range(2)]} for c in range(2)]}
OWES = (95.0, 90.0)  # slot 0: asked at 95, last delivered at 90


def test_no_stall_within_the_timeout_or_when_no_batch_is_owed():
    beats = {0: [OWES, (0.0, 99.0), (0.0, 99.0)], 1: [OWES, (0.0, 99.0), (0.0, 99.0)]}
    assert stall.find(PLAN, 0.0, {0: 95.0, 1: 96.0}, beats, 10, 104.0) is None  # the last batch 8 s ago
    idle = {c: [(90.0, 95.0), (0.0, 50.0), (0.0, 50.0)] for c in (0, 1)}  # delivered after it was asked
    assert stall.find(PLAN, 0.0, {0: 95.0, 1: 95.0}, idle, 10, 200.0) is None


def test_a_stall_names_the_silent_subcollectors_and_the_workers_that_ended_no_step():
    # sub0's worker 0 steps (slowly: its last step ended 4 s ago); the others ended none for 20 s or more
    beats = {0: [OWES, (120.0, 116.0), (0.0, 100.0)], 1: [OWES, (0.0, 100.0), (0.0, 0.0)]}
    found = stall.find(PLAN, 0.0, {0: 101.0, 1: 95.0}, beats, 10, 120.0)
    assert found.silent == [0, 1] and round(found.seconds, 3) == 19.0
    assert [(w["subcollector"], w["worker"], w["global_index"], w["idle_s"]) for w in found.idle] == [
        (0, 1, 1, 20.0), (1, 0, 2, 20.0), (1, 1, 3, None)]
    assert found.describe() == (
        'no batch for 19.0s (launch.stall_timeout 10s): subcollectors 0, 1 delivered nothing; 3 worker(s) ended no '
        'env step in 10s: sub0/w1 (row 1, task 0, "task 0") idle 20.0s; sub1/w0 (row 2, task 1, "task 1") idle 20.0s; '
        'sub1/w1 (row 3, task 1, "task 1") never stepped')


def test_a_subcollector_without_a_heartbeat_file_is_taken_to_owe_a_batch():
    found = stall.find(PLAN, 50.0, {0: None, 1: None}, {}, 10, 61.0)
    assert found.silent == [0, 1] and found.idle == [] and "every worker steps" in found.describe()


def test_the_watch_names_a_stall_once_until_a_batch_comes_out(tmp_path):
    run = RunDir(str(tmp_path))
    state = RunState(PLAN, run, started=0.0, trainer_pid=1)
    for sub in state.subcollectors.values():
        sub.pid, sub.local = 10 + sub.index, False  # no heartbeat read: each owes a batch
    out = io.StringIO()
    watch = StallWatch(state, 10, fail=False, stream=out)
    assert watch.check(100.0) is None and watch.since == 100.0
    assert watch.check(105.0) is None and out.getvalue() == ""
    assert watch.check(111.0) is None and out.getvalue().count("the run stalled: no batch for 11.0s") == 1
    assert watch.check(115.0) is None and out.getvalue().count("the run stalled") == 1  # named once
    state.subcollectors[0].observed = {"time": 116.0}
    assert watch.check(127.0) is None and out.getvalue().count("the run stalled") == 2  # a new stall
    assert [e["silent_subcollectors"] for e in events.read(run)] == [[0, 1], [0, 1]]
    failing = StallWatch(state, 10, fail=True, stream=out)
    failing.since = 100.0
    found = failing.check(130.0)
    assert found.kind == "stalled" and not found.restartable and found.message.startswith("the run stalled: no batch")
