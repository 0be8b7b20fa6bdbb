"""Two LIBERO suites in one topology on real LIBERO: examples/libero_two_suites.yaml trains 2 x 2 with
subcollector 0 on libero_spatial 0-1 and subcollector 1 on libero_object 0-1 (each batch's rows show their own
suite's task language); then `topo eval` runs its eval rows, libero_goal 0-1, a suite training never runs (one
after the other: at most 4 LIBERO workers at a time)."""
import json
import os
import subprocess
import sys

import pytest

from topo.backends.libero import suite_catalog

from tests import preimported
from tests.libero.libero_helpers import ROOT, needs_libero

pytestmark = [pytest.mark.libero, pytest.mark.slow, needs_libero]
SPEC = os.path.join(ROOT, "examples", "libero_two_suites.yaml")

TRAIN = """
import json, sys
import topo

def flat(value):
    value = value.tolist() if hasattr(value, "tolist") else value
    return [value] if isinstance(value, str) else [x for item in value for x in flat(item)]

if __name__ == "__main__":
    source = topo.load_spec(sys.argv[1])
    del source.data["eval"]  # training alone: 4 LIBERO workers (topo eval runs the eval rows after)
    plan = topo.load(topo.compile_source(source))
    with topo.collector(plan, policy=plan.make_policy(), report_dir=sys.argv[2], progress=False) as run:
        batches = [[sorted(set(flat(batch[c]["language_instruction"]))) for c in range(batch.shape[0])]
                   for _, batch in zip(range(2), run.collector)]
    print(json.dumps({"batches": batches, "report": run.report.data}))
    print(run.report, file=sys.stderr)
"""


def language(suite: str, ids) -> list[str]:
    return sorted(suite_catalog(suite).language[i] for i in ids)


def test_two_suites_train_in_their_own_subcollectors_and_a_third_evaluates(tmp_path):
    """Long (minutes here): two real LIBERO runs one after the other, 2 x 2 training on two suites (four workers,
    each building its own suite's scene) and `topo eval` on a third, so that at most 4 LIBERO workers run at a
    time on this 2-core host."""
    env = {**os.environ, "MUJOCO_GL": "egl"}
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    done = preimported.run([sys.executable, str(script), SPEC, str(tmp_path / "train")], capture_output=True, text=True,
                           timeout=900, cwd=ROOT, stdin=subprocess.DEVNULL, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    spatial, objects = language("libero_spatial", (0, 1)), language("libero_object", (0, 1))
    assert out["batches"] == [[spatial, objects]] * 2  # [subcollector 0, subcollector 1] of each batch
    report = out["report"]
    assert [(b["tasks"], b["status"], b["instructions"]) for b in report["first_batch"]] == [
        (["libero_spatial:0", "libero_spatial:1"], "ok", spatial), (["libero_object:0", "libero_object:1"], "ok", objects)]
    assert "    sub1 [ok] tasks libero_object:0-1, groups []: " in done.stderr
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert report["env_closes"] == {"constructed": 4, "closed": 4}
    assert report["processes"]["left_behind"] == [] and report["processes"]["alive_after"] == []
    print(f"2 x 2, two suites: all ready {report['timings_s']['all_ready']:.1f} s")

    evaluated = preimported.run([sys.executable, "-m", "topo.cli", "eval", SPEC, "--rounds", "1", "--report",
                                str(tmp_path / "eval")], capture_output=True, text=True, timeout=900, cwd=ROOT,
                                stdin=subprocess.DEVNULL, env=env)
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    result = json.loads((tmp_path / "eval" / "eval" / "round-001.json").read_text())
    goal = suite_catalog("libero_goal").language
    assert [(t["task_id"], t["held_out"], t["episodes"], t["instruction"]) for t in result["tasks"]] == [
        ("libero_goal:0", True, 1, goal[0]), ("libero_goal:1", True, 1, goal[1])]
    assert [(s["suite"], s["tasks"], s["episodes"]) for s in result["suites"]] == [("libero_goal", 2, 2)]
    assert [(e["task_id"], e["init_state_applied"], e["ended"]) for e in result["episodes_detail"]] == [
        ("libero_goal:0", 0, True), ("libero_goal:1", 0, True)]
    assert "suite libero_goal: " in evaluated.stdout
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert summary["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    assert summary["processes"]["left_behind"] == [] and summary["processes"]["alive_after"] == []
