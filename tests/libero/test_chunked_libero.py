"""``examples/libero_chunked.yaml`` (and its async twin) on real LIBERO, 1 x 2: the recipe's stack (MultiAction,
SuccessReward, StepCounter) in each worker, TinyVLA deciding chunks of 8; 0 envs and 0 stacks outside the workers,
decisions and env steps counted where they ran, a chunked episode replayed bit for bit, nothing left."""
import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from tests import preimported
from tests.launch.launch_helpers import alive, started_pids
from tests.libero.libero_helpers import ROOT, needs_libero

pytestmark = [pytest.mark.libero, pytest.mark.slow, needs_libero]


@pytest.mark.parametrize("example", ["libero_chunked.yaml", "libero_chunked_async.yaml"])
def test_libero_acts_in_chunks_in_each_worker(tmp_path, example):
    """Long (1-2 minutes each here): a real LIBERO launch of the example as written (its workers build their scenes,
    each decision steps 8 times), and for the sync one a `topo replay` that builds the scene again."""
    spec = yaml.safe_load(open(os.path.join(ROOT, "examples", example)))
    spec["launch"]["record_actions"] = True
    path, report_dir = tmp_path / example, tmp_path / "report"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "MUJOCO_GL": "egl"}
    done = preimported.run([sys.executable, "-m", "topo", "launch", str(path), "--report", str(report_dir)],
                           capture_output=True, text=True, timeout=900, cwd=ROOT, stdin=subprocess.DEVNULL, env=env)
    t_end = time.time()
    assert done.returncode == 0, done.stderr[-4000:]
    s = json.loads((report_dir / "summary.json").read_text())
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    steps = s["steps"]
    assert steps["transforms"] == ["MultiAction", "SuccessReward", "StepCounter"]
    assert steps["transforms_built"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}
    assert steps["decisions"] >= 4 and steps["env_steps"] == 8 * steps["decisions"]  # no episode ends mid-chunk
    assert f"  steps: {steps['decisions']} decisions, {steps['env_steps']} env steps" in done.stdout
    assert s["env_closes"] == {"constructed": 2, "closed": 2}
    assert s["processes"]["left_behind"] == [] and s["processes"]["alive_after"] == []
    assert alive(started_pids(report_dir), t_end) == []
    if example == "libero_chunked.yaml":
        replayed = preimported.run([sys.executable, "-m", "topo", "replay", str(report_dir), "w0-r0-e0", "--format",
                                   "json"], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
        out = json.loads(replayed.stdout)
        assert replayed.returncode == 0 and out["identical"] and out["steps"] == 2, (replayed.stdout, replayed.stderr[-2000:])
