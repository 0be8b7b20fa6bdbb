"""End to end: ``topo launch examples/libero_cpu.yaml`` builds real LIBERO workers and collects a batch."""
import json
import os
import subprocess
import sys

import pytest

import topo

from libero_helpers import ROOT, needs_libero

pytestmark = [pytest.mark.libero, pytest.mark.slow, needs_libero]
SPEC = os.path.join(ROOT, "examples", "libero_cpu.yaml")


def test_launch_libero_cpu_example(tmp_path):
    report_dir = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "topo.cli", "launch", SPEC, "--report", str(report_dir), "--quiet"],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads((report_dir / "summary.json").read_text())
    plan = topo.compile_spec(SPEC)
    workers = sum(sub["num_workers"] for sub in plan["subcollectors"])
    assert summary["ok"] is True
    assert summary["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": workers}
    assert summary["env_closes"] == {"constructed": workers, "closed": workers}
    assert summary["processes"]["left_behind"] == [] and summary["processes"]["alive_after"] == []
    expected = [sorted({w["instruction"] for w in sub["workers"]}) for sub in plan["subcollectors"]]
    assert [sorted(b["instructions"]) for b in summary["first_batch"]] == expected
    assert all(b["status"] == "ok" and not b["mismatches"] for b in summary["first_batch"])
