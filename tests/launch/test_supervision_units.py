"""Supervision without processes: the restart port's run side (Recovery), the local collector's side of it
(Respawning), the route a failure takes to the trainer (Delivery) and teardown's stages, each with fakes."""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest

from topo.errors import LaunchError
from topo.launch.supervision import delivery as delivery_module, lives, recovery as recovery_module, restarts, teardown
from topo.launch.supervision.delivery import Aborted, Delivery
from topo.launch.supervision.failure import Failure
from topo.launch.supervision.port import Restarting, RestartPort
from topo.launch.supervision.recovery import Recovery
from topo.launch.supervision.state import Phase

from tests.launch.test_recovery_units import PLAN_WITH_KWARGS, state_of


class FakeMonitor:
    """The monitor's lock and bell; ``decide`` makes a submitted failure a restart (as the monitor would)."""

    def __init__(self, state, decide: bool = True):
        self.lock, self.bell, self.state, self.decide, self.submitted = threading.RLock(), -1, state, decide, []

    def submit(self, found: Failure) -> None:
        self.submitted.append(found)
        if self.decide:
            restarts.decide_restart(self.state, found, 0.0)


def recovery_of(tmp_path, *, decide: bool = True, windows: list | None = None) -> Recovery:
    state = state_of(tmp_path, plan=PLAN_WITH_KWARGS)
    state.phase = Phase.COLLECTING
    windows = windows if windows is not None else []
    return Recovery(state, FakeMonitor(state, decide), Delivery(),
                    window=lambda k: windows.append(k) or contextlib.nullcontext(),
                    restart_policy=lambda c: f"policy of {c}", weights=lambda: "weights")


def died(c: int) -> Failure:
    return Failure("worker-died", f"a worker of {c} died", 1.0, c, 0)


def test_recovery_is_the_restart_port():
    members = {name for name in vars(RestartPort) if not name.startswith("_")}
    assert members == {"bell", "tick", "lost", "settle", "judge", "blame", "begin", "poll_ready", "built", "instantiated",
                       "asked", "permits", "between_batches", "running_free", "waiting", "failed", "abandon",
                       "current_weights"}
    assert all(hasattr(Recovery, name) for name in members - {"current_weights"})  # that one: given at construction


def test_a_decided_restart_begins_with_its_rows_seeds_policy_and_window(tmp_path):
    windows: list[int] = []
    port = recovery_of(tmp_path, windows=windows)
    assert not port.lost(1)
    port.judge(1, died(1))  # the monitor decides a restart of subcollector 1
    assert port.lost(1)
    start = port.begin(1)
    assert isinstance(start, Restarting) and start.restart == 1 and windows == [1]
    assert start.policy_factory == "policy of 1"
    assert [r["seed"] for r in start.rows] == [r["seed"] for r in lives.restart_rows(port.state.plan, 1, 1)]
    assert [r["index"] for r in start.rows] == [0, 1]
    assert not port.lost(1)  # begun: not lost any more
    assert port.state.restarts[0].began_at is not None
    port.instantiated(1)
    assert port.state.restarts[0].ready_at is not None and port.state.subcollectors[1].ready is not None


def test_a_failure_the_monitor_does_not_cure_is_raised(tmp_path, monkeypatch):
    monkeypatch.setattr(recovery_module, "VERDICT_S", 0.01)
    port = recovery_of(tmp_path, decide=False)
    with pytest.raises(LaunchError, match="a worker of 0 died"):
        port.judge(0, died(0), first_records=False)
    assert [f.subcollector for f in port.monitor.submitted] == [0]


def test_the_runs_failure_is_raised_at_the_next_tick(tmp_path):
    port = recovery_of(tmp_path)
    port.tick()  # nothing yet
    port.delivery.deliver(Failure("startup-timeout", "too slow", 1.0))
    with pytest.raises(LaunchError, match="too slow"):
        port.tick()


def test_blame_reads_the_runs_records_under_the_monitors_lock(tmp_path):
    port = recovery_of(tmp_path)
    seen = port.blame(lambda state: Failure("actor-died", f"{len(state.plan['subcollectors'])} subcollectors", 1.0, 0))
    assert seen.message == "2 subcollectors"


def test_the_local_collector_restarts_what_the_port_says_is_lost():
    from topo.launch.local.respawn import RespawningSyncCollector

    calls = []

    class Proc:
        def __init__(self, alive):
            self.alive, self.pid, self.exitcode, self._closed = alive, 40, -9, False

        def is_alive(self):
            return self.alive

    class Port:
        bell = -1

        def __init__(self, lost):
            self._lost = lost

        def tick(self):
            calls.append("tick")

        def lost(self, c):
            return c in self._lost

        def settle(self, c, pid, exitcode):
            calls.append(("settle", c, pid, exitcode))

    collector = object.__new__(RespawningSyncCollector)
    collector._real, collector._starting, collector._live = [Proc(True), Proc(False), Proc(True)], {}, True
    collector._guard = threading.RLock()
    collector._begin = lambda c, old: calls.append(("begin", c))
    collector.supervise(Port(lost={2}), lambda c, rows: None)
    assert [collector._alive(c) for c in range(3)] == [True, True, True]  # torchrl never sees a dead one
    assert calls == ["tick", "tick", ("settle", 1, 40, -9), ("begin", 1), "tick", ("begin", 2)]


def test_a_delivered_failure_interrupts_a_wait_in_topo_and_is_the_one_error_raised():
    delivery = Delivery()
    found = Failure("worker-died", "worker 3 died", 1.0, 0, 3)
    delivery.deliver(found)
    with pytest.raises(LaunchError, match="worker 3 died") as raised:
        with delivery.interruptible():
            pass  # delivered before the wait began: the wait does not start
    assert raised.value is delivery.error() and delivery.error().failure is found
    report, raise_ = delivery.classify(Aborted())
    assert report is raise_ is delivery.error()


def test_a_collector_error_becomes_the_failure_behind_it(monkeypatch):
    monkeypatch.setattr(delivery_module, "SETTLE_S", 0.01)
    delivery = Delivery()
    err = BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(delivery_module, "_from_collector", lambda exc: exc is err)
    report, raised = delivery.classify(err)
    assert isinstance(report, LaunchError) and report is raised
    assert "the collector failed" in str(report)
    loop_error = ValueError("the training loop's own")
    assert delivery.classify(loop_error) == (loop_error, loop_error)  # not topo's: it propagates as it is


def test_teardown_runs_every_stage_in_order_whatever_the_graceful_one_raises(monkeypatch):
    done = []
    monkeypatch.setattr(teardown.processes, "of_run", lambda path, trainer: [])
    monkeypatch.setattr(teardown.processes, "wait", lambda procs, timeout: done.append("wait") or [])

    class Watcher:
        stdin = type("In", (), {"write": lambda self, b: done.append(b), "close": lambda self: None})()

        def wait(self, timeout):
            done.append("watcher")
            return 0

    def graceful(deadline):
        done.append("graceful")
        raise RuntimeError("the engine failed to close")

    record = teardown.Record()
    with pytest.raises(RuntimeError):
        teardown.run(record, teardown.Deadline(1.0), run_path="/nowhere", trainer=1, graceful=graceful,
                     stop_monitor=lambda: done.append("monitor"), watcher=Watcher())
    assert done[:2] == ["graceful", "monitor"] and "wait" in done[2:-2] and done[-2:] == [b"done\n", "watcher"]
    assert record.watcher_exit == 0 and record.left_behind == [] and record.alive_after == []
    assert record.started <= record.finished


def test_the_shutdown_budget_grows_with_the_largest_subcollector_and_the_eval_run():
    plan = {"launch": {}, "subcollectors": [{"num_workers": 2}, {"num_workers": 4}]}
    assert teardown.shutdown_budget(plan) == teardown.SHUTDOWN_BASE_S + 4 * teardown.SHUTDOWN_PER_WORKER_S
    with_eval = {**plan, "eval": {"subcollectors": [{"num_workers": 1}]}}
    assert teardown.shutdown_budget(with_eval) == teardown.shutdown_budget(plan) + teardown.SHUTDOWN_BASE_S + \
        teardown.SHUTDOWN_PER_WORKER_S + sum(teardown.STAGES_S.values())


def test_in_the_background_the_runs_failure_interrupts_the_trainer_wherever_it_is():
    trainers = signal.getsignal(signal.SIGINT)  # the default, or whatever an earlier test in this process left
    delivery = Delivery()
    delivery.background(True)  # the collector runs free: the trainer waits on its replay buffer, in its own code
    found = Failure("worker-died", "a worker of 1 died", 1.0, 1, 0)
    threading.Timer(0.2, delivery.deliver, [found]).start()  # the monitor's thread
    with pytest.raises(Aborted):
        for _ in range(100):
            time.sleep(0.05)
    assert delivery.classify(Aborted())[1].failure is found  # what the run raises: topo's error naming it
    delivery.background(False)
    assert signal.getsignal(signal.SIGINT) == trainers  # the trainer's own handler is back


def test_a_trainer_that_ignores_sigint_still_ignores_it_while_waiting_in_topo():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Delivery().interruptible():
            signal.raise_signal(signal.SIGINT)  # no failure delivered: the trainer's choice holds
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_asking_a_restarted_subcollector_holds_one_heartbeat_map_not_one_a_life(tmp_path):
    """Over a run of days a subcollector restarts hundreds of times: the trainer keeps the current life's beats file
    mapped, not every life's (one file descriptor each)."""
    from topo.runtime import heartbeat

    port = recovery_of(tmp_path)
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    heartbeat.create(port.state.run.path, 1, 0, 2)
    port.asked(1)
    held = fds()
    for restart in range(1, 6):
        port.judge(1, died(1))
        port.begin(1)
        assert port.state.subcollectors[1].restart == restart
        heartbeat.create(port.state.run.path, 1, restart, 2)
        port.asked(1)
        port.asked(1)
    assert fds() == held
    stamped = heartbeat.read(port.state.run.path, 1, 5)[0][0]
    assert stamped > 0  # the current life's slot 0 is the one asked
    port.close()
    assert fds() == held - 1


def test_teardown_ends_a_forkserver_whose_subcollector_exited_before_it_noticed(monkeypatch):
    """A subcollector's forkserver outlives it until it polls its pipe (seconds on a loaded machine): teardown ends
    it at once, never counting it left behind. A real process that never exits on its own stands in for it, its
    parent gone (as a subcollector's forkserver's is)."""
    import subprocess
    import sys

    import psutil

    from topo.launch.supervision import processes

    stand_in = f"import time; time.sleep(120)  # {processes.FORKSERVER}"
    parent = subprocess.run([sys.executable, "-c", f"import subprocess, sys; print(subprocess.Popen([sys.executable, "
                             f"'-c', {stand_in!r}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)"],
                            capture_output=True, text=True, timeout=60)
    server = psutil.Process(int(parent.stdout))
    try:
        assert server.ppid() != os.getpid() and processes.is_forkserver(server)
        monkeypatch.setattr(teardown.processes, "of_run",
                            lambda path, trainer: [p for p in [server] if processes.running(p)])

        class Watcher:
            stdin = type("In", (), {"write": lambda self, b: None, "close": lambda self: None})()

            def wait(self, timeout):
                return 0

        record = teardown.Record()
        teardown.run(record, teardown.Deadline(10.0), run_path="/nowhere", trainer=os.getpid(),
                     graceful=lambda deadline: None, stop_monitor=lambda: None, watcher=Watcher())
        assert record.left_behind == [] and record.alive_after == [] and not processes.running(server)
    finally:
        if processes.running(server):
            server.kill()
