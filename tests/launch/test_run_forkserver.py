"""The run's forkserver (topo/launch/forkserver.py), real processes: every subcollector and env worker of a local
run forks from one server; each worker takes its subcollector's process group and environment, a restarted one
too; the run leaves nothing."""
from __future__ import annotations

import json
import time

import pytest

from tests.launch.launch_helpers import launch, subprocess_env, summary, user_spec, write
from tests.launch.test_restarts import assert_nothing_left

pytestmark = pytest.mark.slow


def test_every_process_forks_from_the_runs_one_forkserver_each_worker_in_its_subcollectors_group(tmp_path):
    """toy 2 x 2; worker 1 of subcollector 1 SIGKILLs itself in its 21st step and its subcollector restarts. Each
    worker's env factory writes its parent, process group and ``TOPO_RESTART``: one parent for all six (the
    server), the group of the subcollector that asked for it, ``1`` in the restart's two."""
    probes = tmp_path / "probes"
    probes.mkdir()
    spec = user_spec("faulty:probed_dying_step", 2, 2, fault_seed=3, after_steps=20, probe_dir=str(probes))
    spec["launch"]["restarts"] = {"max": 1}
    report = tmp_path / "report"
    result = launch(write(tmp_path / "spec.yaml", spec), "--batches", 40, "--report", report, env=subprocess_env())
    t_end = time.time()
    assert result.returncode == 0, result.stderr
    s = summary(report)
    (restart,) = s["restarts"]
    assert s["topology"]["start_methods"] == {"subcollectors": "forkserver", "workers": "forkserver"}
    assert s["processes"]["subcollector_start_methods"] == ["forkserver", "forkserver"]
    seen = [json.loads(p.read_text()) for p in probes.glob("*.json")]
    assert len(seen) == 6 and len({p["ppid"] for p in seen}) == 1  # one server forked them all
    first = {p["pid"]: p for p in seen if p["restart"] is None}
    again = {p["pid"]: p for p in seen if p["restart"] is not None}
    subs = s["processes"]["subcollector_pids"]
    assert sorted(p["pgid"] for p in first.values()) == sorted([subs[0]] * 2 + [restart["replaced"]["subcollector"]] * 2)
    assert sorted(again) == sorted(restart["started"]["workers"])
    assert {(p["restart"], p["pgid"]) for p in again.values()} == {("1", restart["started"]["subcollector"])}
    assert_nothing_left(s, t_end)


def test_a_server_still_serving_past_its_grace_is_reaped_once_it_exits():
    """``forkserver.end`` leaves a server that still serves a process (one that outlived its run) to the teardown;
    once it exits it is reaped, not left a zombie child of the trainer until the trainer exits (a training script
    running run after run would keep one per run; found under load by test_async_mode's two runs in one process).
    A real server and a real process forked from it, here in this process (the trainer's place)."""
    import multiprocessing
    import os
    from multiprocessing import forkserver as mp_forkserver

    import psutil

    from topo.launch import forkserver

    forkserver.start([])
    server = mp_forkserver._forkserver._forkserver_pid
    outliving = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(120,), daemon=False)
    outliving.start()
    forkserver.end(grace=0.2)  # the server serves ``outliving`` still: it outlives the grace
    assert psutil.Process(server).status() != psutil.STATUS_ZOMBIE
    os.kill(outliving.pid, 9)
    outliving.join(30)
    deadline = time.monotonic() + 60
    while psutil.pid_exists(server) and server in [c.pid for c in psutil.Process().children()]:
        assert time.monotonic() < deadline, f"forkserver {server} not reaped: {psutil.Process(server).status()}"
        time.sleep(0.05)


REMOVED = """
import os
from multiprocessing import forkserver as mp_forkserver, util
from topo.launch import forkserver

forkserver.start([])  # a real server, its socket in this process's multiprocessing temp directory
first = util.get_temp_dir()
assert os.path.dirname(mp_forkserver._forkserver._forkserver_address) == first
forkserver.remove_temp_dir()
print(os.path.exists(first))
forkserver.remove_temp_dir()  # nothing left to remove
second = util.get_temp_dir()  # a new one, which this process's exit removes
print(second != first, os.path.isdir(second))
print(second)
forkserver.end()
"""


def test_a_process_about_to_be_sigkilled_removes_its_temp_directory_as_its_exit_would(tmp_path):
    """``forkserver.remove_temp_dir``, what a Ray actor runs before Ray SIGKILLs it: the directory that holds its
    forkserver's socket is gone (every actor of every Ray run left one in /tmp), once; a later one is still removed
    at exit, and the exit says nothing (no finalizer's traceback for the removed one)."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", REMOVED], capture_output=True, text=True, timeout=120,
                          env=subprocess_env(), cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    gone, fresh, second = done.stdout.splitlines()
    assert (gone, fresh) == ("False", "True True")
    assert not os.path.exists(second)
