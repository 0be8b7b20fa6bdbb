"""Real LIBERO in a training loop: TinyVLA acts in each subcollector of the CPU example (2 x 2), the trainer
pushes its weights each iteration, and every batch shows the weights it was collected with; the run builds
every env in its worker, each subcollector collects its planned instructions, and nothing is left."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import topo
from topo.runtime.episodes import Episodes, find_run

from tests import preimported
from tests.launch.script_events import parse
from tests.libero.libero_helpers import needs_libero

ROOT = Path(__file__).resolve().parents[2]
TRAINER = ROOT / "tests" / "launch" / "trainer.py"
SPEC = ROOT / "examples" / "libero_cpu.yaml"


@pytest.fixture(scope="module")
def libero_training(tmp_path_factory):
    """The CPU example trained for 4 iterations, episodes of at most 2 steps, actions recorded, the run kept."""
    import os

    tmp_path = tmp_path_factory.mktemp("libero-train")
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = preimported.run([sys.executable, str(TRAINER), str(SPEC), "--iterations", "4", "--record-actions",
                           "--max-frames-per-traj", "2", "--report", str(tmp_path / "report")],
                           capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    events = list(parse(done.stdout))
    return done, events, tmp_path / "report", env


@pytest.mark.libero
@needs_libero
def test_tinyvla_trains_on_real_libero_through_the_api(libero_training):
    done, events, _, _ = libero_training
    assert done.returncode == 0, done.stderr[-3000:]
    batches = [e for e in events if e["event"] == "batch"]
    assert [b["versions"] for b in batches] == [[0], [1], [2], [3]]
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


@pytest.mark.libero
@needs_libero
def test_a_libero_episode_resolves_to_its_row_and_replays_bit_for_bit(libero_training, tmp_path):
    """Provenance on real LIBERO: each episode of the batches resolves to its plan row (task, instruction,
    init state, seed) and the versions that acted; a second episode of a worker (its reset after the first)
    is rebuilt from its row and seed state in a fresh process and matches every recorded step."""
    done, events, report_dir, env = libero_training
    assert done.returncode == 0, done.stderr[-3000:]
    episodes = Episodes(find_run(str(report_dir)))
    rows = {row["global_index"]: row for row in topo.load(str(SPEC)).rows}
    seen = {}
    for batch in (e for e in events if e["event"] == "batch"):
        for value, version in batch["episodes"]:
            seen.setdefault(value, set()).add(version)
    for value, versions in seen.items():
        s = episodes.get(value).summary()
        row = rows[s["global_index"]]
        assert (s["task_id"], s["instruction"], s["seed"]) == (row["task_id"], row["instruction"], row["seed"])
        assert s["init_state"] is not None and set(s["policy_versions"]) == versions
    second = episodes.get("w0-r0-e1")
    assert second.end["steps"] == 2 and second.summary()["recorded_actions"]
    replayed = preimported.run([sys.executable, "-m", "topo", "replay", str(report_dir), "w0-r0-e1", "--format", "json",
                               "--video", str(tmp_path / "w0-r0-e1.png")],
                               capture_output=True, text=True, timeout=600, env=env)
    out = json.loads(replayed.stdout)
    assert replayed.returncode == 0 and out["identical"] and out["steps"] == 2, (replayed.stdout, replayed.stderr[-2000:])
    assert (tmp_path / "w0-r0-e1.png").stat().st_size > 0
