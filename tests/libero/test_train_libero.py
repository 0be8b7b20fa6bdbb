"""Real LIBERO in a training loop: TinyVLA acts in each subcollector of the CPU example (2 x 2), the trainer
pushes its weights each iteration, and every batch shows the weights it was collected with."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.libero.libero_helpers import needs_libero

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "tests" / "launch" / "trainer.py"


@pytest.mark.libero
@needs_libero
def test_tinyvla_trains_on_real_libero_through_the_api(tmp_path):
    import os

    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([sys.executable, str(TRAINER), str(ROOT / "examples" / "libero_cpu.yaml"), "--iterations", "2"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    batches = [e for e in events if e["event"] == "batch"]
    assert [b["versions"] for b in batches] == [[0], [1]]
    assert max(b["diff"] for b in batches) < 1e-4  # the trainer's copy computes the actions the workers took
    (after,) = [e for e in events if e["event"] == "after"]
    report = after["report"]
    assert report["ok"], report["error"]
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert [e["status"] for e in report["first_batch"]] == ["ok", "ok"]
    assert report["env_closes"] == {"constructed": 4, "closed": 4}
    assert report["processes"]["left_behind"] == [] and report["processes"]["alive_after"] == []
