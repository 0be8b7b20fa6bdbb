"""Evaluation on real LIBERO: ``topo eval`` on held-out tasks, each (task, init state) once per round,
started from the planned init state, the same episodes seeing the same observations in both rounds."""
import json
import os
import subprocess
import sys

import pytest

from tests.libero.libero_helpers import ROOT, needs_libero

pytestmark = [pytest.mark.libero, pytest.mark.slow, needs_libero]
SPEC = os.path.join(ROOT, "examples", "libero_cpu_eval.yaml")


def test_topo_eval_on_held_out_libero_tasks(tmp_path):
    report = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "topo.cli", "eval", SPEC, "--rounds", "2", "--report", str(report)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT, stdin=subprocess.DEVNULL,
                          env={**os.environ, "MUJOCO_GL": "egl"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    one, two = (json.loads((report / "eval" / f"round-00{n}.json").read_text()) for n in (1, 2))
    for r in (one, two):
        assert [(t["task_id"], t["held_out"], t["episodes"]) for t in r["tasks"]] == [(2, True, 2), (3, True, 2)]
        assert [(e["task_id"], e["init_state_id"], e["init_state_applied"], e["worker"]) for e in r["episodes_detail"]] \
            == [(2, 0, 0, 0), (2, 1, 1, 0), (3, 0, 0, 1), (3, 1, 1, 1)]
        assert r["other_init_states"] == [] and r["other_weights"] == []
        assert all(e["ended"] and e["length"] <= 16 for e in r["episodes_detail"])
    checksums = [[e["checksum"] for e in r["episodes_detail"]] for r in (one, two)]
    assert checksums[0] == checksums[1]  # the same weights, seeds and init states: the same observations
    assert len(set(checksums[0])) == 4  # and each (task, init state) its own
    assert "instruction" in proc.stdout and "pick up the black bowl" in proc.stdout
    summary = json.loads((report / "summary.json").read_text())
    assert summary["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    assert summary["env_closes"] == {"constructed": 2, "closed": 2}
    assert summary["processes"]["left_behind"] == [] and summary["processes"]["alive_after"] == []
