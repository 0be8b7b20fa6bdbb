"""The inference server on shared-memory slots (toy 2 x 2, real processes): a subcollector restarted after its
worker was killed gets a working client (its predecessor's slot) and acts with the weights last pushed."""
from __future__ import annotations

import json
import sys
import time

import pytest

from tests import preimported
from tests.launch.launch_helpers import HANG_GUARD_S, HERE, subprocess_env, toy_spec, write
from tests.launch.script_events import parse
from tests.launch.test_restarts import assert_nothing_left, of

pytestmark = pytest.mark.slow


def test_a_restarted_subcollector_asks_the_server_through_its_slot_with_the_pushed_weights(tmp_path):
    """Long: a real toy 2 x 2 training run with the inference server, a worker SIGKILLed and its subcollector
    started again (a new process, its workers and its client), 3 iterations."""
    report_dir = tmp_path / "report"
    spec = write(tmp_path / "toy.yaml", toy_spec(2, 2))
    done = preimported.run([sys.executable, str(HERE / "trainer.py"), str(spec), "--placement", "server", "--then",
                           "kill-worker", "--restarts", "1", "--iterations", "3", "--report", str(report_dir)],
                           env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    t_end = time.time()
    events = list(parse(done.stdout))
    assert done.returncode == 0 and not of(events, "launch-error"), done.stderr
    batches = of(events, "batch")
    assert [b["versions"] for b in batches] == [[i] for i in range(3)]  # complete, acting with the pushed weights
    assert max(b["diff"] for b in batches) < 1e-5  # the server's reply is what the trainer's copy computes
    assert batches[-1]["restarts"] == [[1, "collecting"]]
    report = json.loads((report_dir / "summary.json").read_text())
    assert report["ok"] and [r["subcollector"] for r in report["restarts"]] == [1]
    assert report["restarts"][0]["first_batch"]["status"] == "ok"
    assert (report["policy"]["placement"], report["policy"]["transport"]) == ("server", "slots")
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 6}
    spent = report["time_breakdown"]  # where the time went, the restarted subcollector's two starts together
    assert spent["verdict"] in ("env-bound", "inference-bound", "trainer-bound") and spent["line"].startswith(
        spent["verdict"] + ": ")
    assert [row["subcollector"] for row in spent["subcollectors"]] == [0, 1]
    assert all(row["env_step_ms"]["count"] >= 2 * 3 and row["inference_wait_ms"]["count"] >= 3
               for row in spent["subcollectors"])  # 2 workers x 3 batches of steps; a policy call per step
    assert spent["server"]["requests_per_forward"] >= 1 and spent["trainer"]["batches"] == 3
    assert f"  time: {spent['line']}" in done.stderr.splitlines()  # the human report
    assert_nothing_left(report, t_end)
