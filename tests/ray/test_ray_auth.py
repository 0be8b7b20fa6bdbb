"""Who may join: a local head with Ray's token authentication on (``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN``, as
the runbook starts it). ``topo doctor`` with the token says it refuses a client without one (no warning); without
the token, doctor and launch stop at once naming the variables; a launch with it runs (toy 1 x 2)."""
from __future__ import annotations

import secrets
import time

import pytest

from tests.ray.ray_head_helpers import ENV, RayHead
from tests.ray.test_ray_doctor import doctor
from tests.ray.test_ray_launch import launch, needs_ray, toy_ray_spec

pytestmark = [pytest.mark.slow, needs_ray]
REFUSED = "refuses a client without its token, and this process sends none: set RAY_AUTH_MODE=token"


@pytest.fixture(scope="module")
def head():
    head = RayHead(cpus=2, token=secrets.token_hex(32))
    try:
        yield head
    finally:
        head.stop()


def small(address: str) -> dict:
    spec = toy_ray_spec(address)
    spec["topology"]["subcollectors"] = 1
    del spec["topology"]["start_method"]  # topo's default, forkserver: the point here is the token, not spawn
    return spec


def test_doctor_with_the_token_finds_the_cluster_closed_to_others(head, tmp_path):
    result = doctor(tmp_path, small(head.address), env=head.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok    auth       the Ray cluster at {head.address} refuses a client without its token\n" in result.stdout
    assert "auth" not in "".join(line for line in result.stdout.splitlines() if line.startswith("warn"))


def test_without_the_token_doctor_and_launch_stop_at_once_naming_it(head, tmp_path):
    start = time.monotonic()
    checked = doctor(tmp_path, small(head.address), env=ENV)  # RAY_AUTH_MODE=disabled
    launched, _ = launch(tmp_path, "refused", small(head.address), env={**ENV, "RAY_AUTH_MODE": ""})
    assert time.monotonic() - start < 60  # not Ray's 20 s of retries each, nor a hang
    for result in (checked, launched):
        assert result.returncode == 1 and f"error: the Ray cluster at {head.address} {REFUSED}" in result.stderr
        assert "RAY_AUTH_TOKEN" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "refused").exists()  # refused before anything started


def test_a_launch_with_the_token_runs_on_the_cluster(head, tmp_path):
    result, _ = launch(tmp_path, "auth", small(head.address), "--batches", "2", env=head.env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "run ok: 1 subcollector(s), 2 env workers, 2/2 batch(es)" in result.stdout
    assert "left behind 0, alive after 0" in result.stdout
