"""One local head for the module, Ray's token authentication on (``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN``, as
the runbook starts it). Who may join: ``topo doctor`` with the token says it refuses a client without one (no
warning); without the token, doctor and launch stop at once naming the variables. Then ``topo launch`` on it with the
token (2 actors x 2 toy workers, sync and async): no env on the driver, the planned instructions and seeds, every env
closed before the actors die, no process left once the head stops (the module's last test stops it)."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time

import pytest

import topo
from topo.launch.ray.records import NODE_RUNS
from tests.ray.ray_head_helpers import ENV, RayHead
from tests.ray.test_ray_training import doctor
from tests.ray.test_ray_launch import alive, assert_clean_remote_launch, launch, needs_ray, toy_ray_spec

pytestmark = [pytest.mark.slow, needs_ray]
REFUSED = "refuses a client without its token, and this process sends none: set RAY_AUTH_MODE=token"


@pytest.fixture(scope="module")
def head():
    tmpdir = tempfile.mkdtemp(prefix="topo-tmp-")  # short: multiprocessing's sockets go there
    head = RayHead(cpus=2, token=secrets.token_hex(32), tmpdir=tmpdir)
    try:
        yield head
    finally:
        head.stop()
        shutil.rmtree(tmpdir, ignore_errors=True)


def small(address: str) -> dict:
    spec = toy_ray_spec(address)
    spec["topology"]["subcollectors"] = 1
    del spec["topology"]["start_method"]  # topo's default, forkserver: the point here is the token, not spawn
    return spec


def test_doctor_with_the_token_finds_the_cluster_closed_to_others(head, tmp_path):
    """``topo doctor`` with the token: the auth check is ok, no warning about it. Its length (30 s beside two CPU
    hogs): a doctor whose Ray task on the head starts probes that import torch and torchrl, forked from a server of
    its own (Ray reads the token at import: tests/preimported.py), which starts here."""
    result = doctor(tmp_path, small(head.address), env=head.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok    auth       the Ray cluster at {head.address} refuses a client without its token\n" in result.stdout
    assert "auth" not in "".join(line for line in result.stdout.splitlines() if line.startswith("warn"))


def test_without_the_token_doctor_and_launch_stop_at_once_naming_it(head, tmp_path):
    """Without the token, doctor and launch each exit 1 at once, naming the variables, and start nothing. Its length
    (31 s beside two CPU hogs): two commands, each forked from a server for its own Ray variables (one not started
    before in its test process starts here: an import of torch and torchrl); the 60 s bound holds Ray's retries
    off (20 s each)."""
    start = time.monotonic()
    checked = doctor(tmp_path, small(head.address), env=ENV)  # RAY_AUTH_MODE=disabled
    launched, _ = launch(tmp_path, "refused", small(head.address), env={**ENV, "RAY_AUTH_MODE": ""})
    assert time.monotonic() - start < 60  # not Ray's 20 s of retries each, nor a hang
    for result in (checked, launched):
        assert result.returncode == 1 and f"error: the Ray cluster at {head.address} {REFUSED}" in result.stderr
        assert "RAY_AUTH_TOKEN" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "refused").exists()  # refused before anything started


def test_sync_and_async_launches_with_the_token_run_on_the_head_and_leave_nothing(head, tmp_path):
    """Two launches on the module's head with the token (sync and async; spawned workers, children of the actors),
    each with its actors and their env workers started and torn down, then the head stopped: nothing of them is left.
    The module's last test (it stops the head); two launches, one after the other, make its length. Nothing of
    theirs is left in the temp directory either: each actor's multiprocessing directory (its forkserver's socket),
    which its SIGKILL by Ray left in /tmp before, is removed before it."""
    runs = {sync: launch(tmp_path, "sync" if sync else "async", toy_ray_spec(head.address, sync), "--batches",
                         "2" if sync else "8", env=head.env)  # 2 actors x 1 CPU; 4 env workers Ray does not count
            for sync in (True, False)}
    head.stop()
    stopped = time.time()
    left = sorted(os.listdir(head.env["TMPDIR"]))
    assert [name for name in left if name.startswith("pymp-")] == [], left  # multiprocessing's, of any process
    assert os.listdir(os.path.join(head.env["TMPDIR"], NODE_RUNS)) == []  # each node's run directory, pulled
    for sync, (result, spec) in runs.items():
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "left behind 0, alive after 0" in result.stdout
        s = json.loads((tmp_path / ("sync" if sync else "async") / "summary.json").read_text())
        plan = topo.compile_spec(str(spec))
        assert_clean_remote_launch(s, plan, tmp_path / s["run_dir"])
        if sync:  # one stacked batch: every actor's workers
            assert "run ok: 2 subcollector(s), 4 env workers, 2/2 batch(es)" in result.stdout
            for sub, seen in zip(plan["subcollectors"], s["first_batch"]):
                assert seen["status"] == "ok", seen
                assert seen["instructions"] == sorted({r["instruction"] for r in sub["workers"]})
                assert seen["groups"] == sorted({r["group"] for r in sub["workers"]})
        else:  # one actor's batch at a time, first ready first served
            assert {seen["status"] for seen in s["first_batch"]} <= {"ok", "not observed"}
            assert "ok" in {seen["status"] for seen in s["first_batch"]}
        p = s["processes"]
        pids = set(p["started"]) | set(p["worker_pids"]) | set(p["subcollector_pids"])
        assert alive(pids, stopped) == []
