"""The launch pieces without a topology: first-batch checks, blame from fabricated records, shutdown budget,
start slots, the worker factory's markers, and a torch-free command import."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from topo.launch.supervision import failure
from topo.launch import observe
from topo.launch.supervision.teardown import SHUTDOWN_BASE_S, SHUTDOWN_PER_WORKER_S, shutdown_budget
from topo.launch.supervision.processes import Death
from topo.launch.supervision.state import Phase, RunState
from topo.runtime.rundir import HOST, RUN_DIR_VAR, SLOTS_VAR, RunDir


def plan_of(*subs: list[tuple[str, int]]) -> dict:
    """A plan skeleton: per subcollector, per worker (instruction, group)."""
    return {
        "launch": {"shutdown_timeout": None},
        "subcollectors": [
            {"index": c, "num_workers": len(rows),
             "workers": [{"index": w, "instruction": i, "group": g, "global_index": 2 * c + w, "seed": 2 * c + w}
                         for w, (i, g) in enumerate(rows)]}
            for c, rows in enumerate(subs)
        ],
    }


PLAN = plan_of([("a", 0), ("b", 1)], [("a", 2), ("b", 3)])


def seen(*workers: tuple[str, int]) -> list[dict]:
    return [{"instructions": [i], "groups": [g]} for i, g in workers]


def observed(first: list[dict], batches: int = 1, versions=None) -> dict:
    return {"first": first, "batches": batches, "policy_versions": versions}


def test_first_batches_matching_the_plan():
    result = observe.check(PLAN, {0: observed(seen(("a", 0), ("b", 1))), 1: observed(seen(("a", 2), ("b", 3)), 4, [2])})
    assert [r["status"] for r in result] == ["ok", "ok"]
    assert result[1]["groups"] == [2, 3] and result[1]["instructions"] == ["a", "b"]
    assert (result[1]["batches"], result[1]["policy_versions"]) == (4, [2])


def test_a_swapped_instruction_is_a_mismatch_and_a_silent_subcollector_not_observed():
    result = observe.check(PLAN, {0: observed(seen(("b", 0), ("b", 1))), 1: None})
    assert result[0]["status"] == "mismatch"
    assert result[0]["mismatches"] == [{"worker": 0, "field": "instructions", "planned": ["a"], "observed": ["b"]}]
    assert result[1] == {"subcollector": 1, "status": "not observed"}


def test_nothing_observable_and_env_chosen_instructions():
    assert [r["status"] for r in observe.check(PLAN, {0: observed([{}, {}]), 1: observed([{}, {}])})] == [
        "nothing observable", "nothing observable"]
    free = plan_of([(None, 0)])
    assert observe.check(free, {0: observed(seen(("own", 0)))})[0]["status"] == "ok"


# -- failure.decide on fabricated records ----------------------------------------------------------

def state_with(tmp_path, *markers: dict) -> RunState:
    """A RunState of PLAN whose run directory holds ``markers`` (name, pid, time, fields), read once."""
    run = RunDir(str(tmp_path))
    for i, m in enumerate(markers):
        where = tmp_path / "markers"
        where.mkdir(exist_ok=True)
        (where / f"{m['name']}.{i}.json").write_text(json.dumps({"host": HOST, "ppid": 1, **m}))
    state = RunState(PLAN, run, started=100.0, trainer_pid=1)
    state.update()
    return state


def started(c: int, w: int, pid: int, t: float) -> dict:
    return {"name": "started", "pid": pid, "time": t, "worker": {"subcollector": c, "index": w}}


def sub(c: int, pid: int, t: float) -> dict:
    return {"name": "subcollector", "pid": pid, "time": t, "index": c, "start_method": "spawn"}


def test_the_first_death_is_blamed_whatever_order_it_is_seen_in(tmp_path):
    state = state_with(tmp_path, sub(0, 10, 101), sub(1, 11, 101), started(1, 0, 20, 102), started(1, 1, 21, 102))
    state.record_death(Death(21, 110.0, "killed by SIGKILL"))  # the killed worker
    state.record_death(Death(20, 109.0 + 2, "exit code 1"))  # its neighbour, later
    state.record_death(Death(11, 110.5, "exit code 1"))  # its subcollector, after it
    found = failure.decide(state)
    assert (found.kind, found.subcollector, found.worker, found.pid, found.how) == (
        "worker-died", 1, 1, 21, "killed by SIGKILL")
    assert "env worker died during construction without a traceback (killed by SIGKILL, pid 21)" in found.message
    assert found.row == PLAN["subcollectors"][1]["workers"][1]
    err = found.error()
    assert (err.subcollector, err.worker, err.row["global_index"], err.exit_code) == (1, 1, 3, 1)


def test_seen_at_one_instant_a_sigtermed_sibling_is_not_blamed(tmp_path):
    """A worker SIGKILLed, its sibling SIGTERMed by the subcollector's shutdown, both seen in one poll."""
    state = state_with(tmp_path, sub(0, 10, 101), sub(1, 11, 101), started(1, 0, 20, 102), started(1, 1, 21, 102))
    state.record_death(Death(20, 110.0, "killed by SIGTERM"))  # seen first, listed first
    state.record_death(Death(21, 110.0, "killed by SIGKILL"))
    found = failure.decide(state)
    assert (found.subcollector, found.worker, found.pid, found.how) == (1, 1, 21, "killed by SIGKILL")


def test_a_subcollector_dying_first_is_blamed_over_its_orphans(tmp_path):
    state = state_with(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102),
                       {"name": "constructed", "pid": 20, "time": 103, "seed": 0, "seconds": 1.0,
                        "worker": {"subcollector": 0, "index": 0}})
    state.record_death(Death(20, 120.0))
    state.record_death(Death(10, 119.0, "killed by SIGKILL"))
    found = failure.decide(state)
    assert (found.kind, found.subcollector, found.worker) == ("subcollector-died", 0, None)
    assert found.message == "subcollector process ended unexpectedly (killed by SIGKILL, pid 10)"


def test_at_one_instant_a_worker_is_blamed_before_its_subcollector(tmp_path):
    state = state_with(tmp_path, sub(0, 10, 101), started(0, 1, 20, 102))
    state.record_death(Death(10, 115.0))
    state.record_death(Death(20, 115.0))
    assert failure.decide(state).kind == "worker-died"


def test_a_builder_traceback_comes_before_the_deaths_it_causes(tmp_path):
    state = state_with(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102),
                       {"name": "failed", "pid": 20, "time": 104, "traceback": "Traceback...\nValueError: bad kwarg",
                        "worker": {"subcollector": 0, "index": 0}})
    state.record_death(Death(20, 104.5, "exit code 1"))
    state.record_death(Death(10, 105.0, "exit code 1"))
    found = failure.decide(state)
    assert (found.kind, found.worker, found.message) == (
        "builder-raised", 0, "env worker failed during construction: ValueError: bad kwarg")
    assert found.traceback.endswith("bad kwarg")


def test_a_step_traceback_comes_before_the_clean_exits_the_collector_shutdown_causes(tmp_path):
    # async mode: torchrl queues a worker's step error, its iterator shuts down, and every worker exits 0
    state = state_with(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102), started(0, 1, 21, 102),
                       {"name": "constructed", "pid": 21, "time": 103, "seed": 1, "seconds": 0.5,
                        "worker": {"subcollector": 0, "index": 1}},
                       {"name": "failed", "pid": 21, "time": 108, "traceback": "Traceback...\nstruct.error: too small",
                        "worker": {"subcollector": 0, "index": 1}})
    state.record_death(Death(20, 108.5, "exit code 0"))
    state.record_death(Death(21, 108.6, "exit code 0"))
    found = failure.decide(state)
    assert (found.kind, found.worker, found.message) == (
        "worker-raised", 1, "env worker raised while collecting: struct.error: too small")
    assert found.restartable and found.traceback.endswith("too small")


def test_closed_workers_and_deaths_after_teardown_began_are_not_failures(tmp_path):
    state = state_with(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102),
                       {"name": "closed", "pid": 20, "time": 130, "seconds": 0.1,
                        "worker": {"subcollector": 0, "index": 0}})
    state.record_death(Death(20, 131.0))
    assert failure.decide(state) is None
    state.record_death(Death(10, 140.0))
    assert failure.decide(state, until=135.0) is None
    assert failure.decide(state).kind == "subcollector-died"


def test_policy_factory_and_server_failures(tmp_path):
    state = state_with(tmp_path, {"name": "server", "pid": 30, "time": 101, "role": "server", "in_keys": [],
                                  "out_keys": []},
                       {"name": "policy-failed", "pid": 11, "time": 103, "role": "subcollector", "subcollector": 1,
                        "traceback": "Traceback...\nTypeError: no"})
    found = failure.decide(state)
    assert (found.kind, found.subcollector, found.message) == (
        "policy-failed", 1, "policy factory failed in subcollector 1: TypeError: no")
    state.record_death(Death(30, 102.0, "killed by SIGTERM"))
    assert failure.decide(state).message == "policy server ended unexpectedly (killed by SIGTERM, pid 30)"


def test_startup_timeout_names_what_each_worker_was_doing(tmp_path):
    state = state_with(tmp_path, sub(0, 10, 101), started(0, 0, 20, 102))
    found = failure.startup_timeout(state, 30, now=132.0)
    assert found.kind == "startup-timeout"
    assert found.message == ("startup deadline of 30s passed: 4 of 4 env workers not ready: sub0/w0 constructing for "
                             "30.0s (pid 20); sub0/w1 not started; sub1/w0 not started; sub1/w1 not started")
    assert state.phase is Phase.STARTING


def test_a_startup_timeout_under_ray_before_any_record_points_at_pending_actors(tmp_path):
    state = state_with(tmp_path)
    state.watch_workers = False  # placement.engine: ray
    message = failure.startup_timeout(state, 30, now=132.0).message
    assert message.startswith("startup deadline of 30s passed: 4 of 4 env workers not ready: sub0/w0 not started")
    assert message.endswith("an actor waits, unstarted, for resources no node has free: `ray status` lists the "
                            "pending demands")
    state.watch_workers = True
    assert "ray status" not in failure.startup_timeout(state, 30, now=132.0).message


def test_an_env_built_in_the_trainer_counts_as_the_trainers(tmp_path):
    state = state_with(tmp_path, sub(0, 1, 101), sub(0, 10, 102))  # pid 1 is the trainer here
    assert state.subcollectors[0].pid == 10 and state.subcollectors[0].built_elsewhere == [1]
    assert state.role_of(1) == "trainer" and state.role_of(10) == "subcollector"


def test_shutdown_budget_is_sized_to_the_largest_subcollector():
    plan = plan_of([("a", 0)] * 3, [("a", 0)] * 5)
    assert shutdown_budget(plan) == SHUTDOWN_BASE_S + 5 * SHUTDOWN_PER_WORKER_S
    plan["launch"]["shutdown_timeout"] = 42
    assert shutdown_budget(plan) == 42.0


def test_start_slots_bound_concurrent_constructions(tmp_path, monkeypatch):
    monkeypatch.setenv(SLOTS_VAR, "2")
    run = RunDir(str(tmp_path))
    inside, peak, lock = [0], [0], threading.Lock()

    def build():
        with run.start_slot():
            with lock:
                inside[0] += 1
                peak[0] = max(peak[0], inside[0])
            time.sleep(0.2)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=build) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2


def test_make_env_writes_markers_and_records_close(tmp_path, monkeypatch):
    from topo.worker import make_env

    monkeypatch.setenv(RUN_DIR_VAR, str(tmp_path))
    worker = {"subcollector": 1, "index": 2, "global_index": 5}
    env = make_env(builder="topo.envs.toy:build", env={"instruction": "lift"}, seed=7, render_gpu=None, worker=worker)
    assert env.reset()["language_instruction"] == "lift"
    env.close()
    env.close(raise_if_closed=False)  # a second close writes no second marker
    names = [m["name"] for m in RunDir(str(tmp_path)).read_new("markers")]
    assert names == ["started", "constructed", "closed"]
    with pytest.raises(TypeError):
        make_env(builder="topo.envs.toy:build", env={"no_such_kwarg": 1}, worker=worker)
    (failed,) = [m for m in RunDir(str(tmp_path)).read_new("markers") if m["name"] == "failed"]
    assert failed["worker"] == worker and "no_such_kwarg" in failed["traceback"]


def test_make_env_applies_the_seed_without_a_run_directory(monkeypatch):
    from topo.worker import make_env

    monkeypatch.delenv(RUN_DIR_VAR, raising=False)
    images = [make_env(builder="topo.envs.toy:build", env={}, seed=seed).reset()["observation", "image"]
              for seed in (3, 3, 4)]
    assert (images[0] == images[1]).all() and not (images[0] == images[2]).all()


def test_importing_the_command_imports_no_torch():
    code = "import sys, topo.launch.command; sys.exit('torch' in sys.modules or 'torchrl' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_make_env_gives_the_worker_the_users_gl_back(tmp_path, monkeypatch):
    from topo.runtime import gl
    from topo.worker import make_env

    monkeypatch.setenv(RUN_DIR_VAR, str(tmp_path))
    monkeypatch.setenv("MUJOCO_GL", "disable")  # as the collector process held it
    monkeypatch.setenv(gl.HELD_VAR, "egl")
    before = gl.loaded_libraries()
    make_env(builder="topo.envs.toy:build", env={}, worker={"subcollector": 0, "index": 0}).close()
    assert os.environ["MUJOCO_GL"] == "egl" and gl.HELD_VAR not in os.environ
    (started,) = [m for m in RunDir(str(tmp_path)).read_new("markers") if m["name"] == "started"]
    assert started["inherited_gl"] == before  # what this process had mapped before the builder ran


def test_the_report_says_why_each_env_that_was_built_never_closed(tmp_path):
    """A worker killed (it died), its sibling killed by the restart that retired their start (ended by it, though
    its death is seen too), one killed by the teardown, one with no record: the closes line counts each why."""
    from topo.launch import report
    from topo.launch.supervision.restarts import Restart

    def built(c: int, w: int, pid: int) -> dict:
        return {"name": "constructed", "pid": pid, "time": 103.0, "seed": 0, "seconds": 1.0,
                "worker": {"subcollector": c, "index": w}}

    closed = {"name": "closed", "pid": 30, "time": 120.0, "seconds": 0.1, "worker": {"subcollector": 0, "index": 0}}
    state = state_with(tmp_path, sub(0, 10, 101), sub(1, 11, 101), started(0, 0, 30, 102), started(0, 1, 31, 102),
                       started(1, 0, 20, 102), started(1, 1, 21, 102), built(0, 0, 30), built(0, 1, 31),
                       built(1, 0, 20), built(1, 1, 21), closed)
    state.record_death(Death(21, 110.0, "killed by SIGKILL"))
    found = failure.decide(state)
    state.retire(1, PLAN["subcollectors"][1]["workers"])
    state.restarts.append(Restart(1, 1, found, decided_at=111.0))
    state.record_death(Death(20, 112.0, "killed by SIGKILL"))  # the restart retiring its start
    items = report.not_closed(state, killed=[31])
    assert [(i["subcollector"], i["worker"], i["restart"], i["pid"], i["why"]) for i in items] == [
        (1, 0, 0, 20, "ended by its subcollector's restart"), (1, 1, 0, 21, "died (killed by SIGKILL)"),
        (0, 1, 0, 31, "killed at teardown")]
    assert report._why_not_closed(items) == (" (not closed: 1 ended by its subcollector's restart, 1 died (killed by "
                                             "SIGKILL), 1 killed at teardown)")
    assert report.not_closed(state, killed=[])[-1]["why"] == "no close record" and report._why_not_closed([]) == ""


def test_two_runs_given_one_report_directory_each_keep_their_report(tmp_path):
    """Each run's report in its own run directory too; the directory's summary.json is the run that ended last,
    replaced whole."""
    from topo.launch.report import Report

    report_dir = tmp_path / "report"
    first, second = report_dir / "topo-run-a", report_dir / "topo-run-b"
    for run_dir in (first, second):
        run_dir.mkdir(parents=True)
        Report({"run_dir": str(run_dir), "error": None}).file(str(run_dir), str(report_dir))
    assert json.loads((first / "summary.json").read_text())["run_dir"] == str(first)
    assert json.loads((second / "summary.json").read_text())["run_dir"] == str(second)
    assert json.loads((report_dir / "summary.json").read_text())["run_dir"] == str(second)
    assert not list(report_dir.rglob("*.tmp"))
