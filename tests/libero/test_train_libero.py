"""Real LIBERO in a training loop: TinyVLA acts in each subcollector of the CPU example (2 x 2), the trainer
pushes its weights each iteration, and every batch shows the weights it was collected with; the run builds
every env in its worker, each subcollector collects its planned instructions, and nothing is left."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import topo

from tests.libero.libero_helpers import needs_libero

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "tests" / "launch" / "trainer.py"
SPEC = ROOT / "examples" / "libero_cpu.yaml"


@pytest.mark.libero
@needs_libero
def test_tinyvla_trains_on_real_libero_through_the_api(tmp_path):
    import os

    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([sys.executable, str(TRAINER), str(SPEC), "--iterations", "2"],
                          capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    batches = [e for e in events if e["event"] == "batch"]
    assert [b["versions"] for b in batches] == [[0], [1]]
    assert max(b["diff"] for b in batches) < 1e-4  # the trainer's copy computes the actions the workers took
    (after,) = [e for e in events if e["event"] == "after"]
    report = after["report"]
    assert report["ok"] is True, report["error"]
    plan = topo.compile_spec(str(SPEC))
    workers = sum(sub["num_workers"] for sub in plan["subcollectors"])
    assert workers == 4
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": workers}
    assert report["env_closes"] == {"constructed": workers, "closed": workers}
    assert report["processes"]["left_behind"] == [] and report["processes"]["alive_after"] == []
    expected = [sorted({w["instruction"] for w in sub["workers"]}) for sub in plan["subcollectors"]]
    assert [sorted(b["instructions"]) for b in report["first_batch"]] == expected
    assert all(b["status"] == "ok" and not b["mismatches"] for b in report["first_batch"])
