"""Same spec, same seed, same run: the training example, run twice on a toy 2 x 2 topology with weight updates,
prints the same losses, the same digest of its batches and of its weights; another seed, other ones."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.launch.launch_helpers import HANG_GUARD_S, subprocess_env, toy_spec, write

pytestmark = pytest.mark.slow
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent.parent
DIGEST = re.compile(r"^run digest: ([0-9a-f]{64}) \((\d+) batches\); weights ([0-9a-f]{64})$", re.M)
ITERATION = re.compile(r"^iteration \d+: .*, loss [-+0-9.]+", re.M)


def train(spec, seed: int) -> tuple[tuple[str, str, str], list[str], dict]:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "train_grpo.py"), str(spec), "--iterations", "3",
                           "--lr", "1e-2", "--seed", str(seed)], cwd=ROOT, env=subprocess_env(), capture_output=True,
                          text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-3000:]
    (digest,) = DIGEST.findall(done.stdout)
    report = re.search(r"batches digest: sha256 ([0-9a-f]{64}) over (\d+) batch", done.stdout)
    return digest, ITERATION.findall(done.stdout), {"sha256": report.group(1), "count": int(report.group(2))}


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path):
    """Three training runs in fresh processes (the same seed twice, another once), each 3 batches and updates on 2 x 2:
    reproducibility is only shown across whole launches, each paying its processes' start and teardown."""
    spec = toy_spec(2, 2, collector={"frames_per_batch": 16},
                    policy={"factory": "topo.policies.tinyvla:make",
                            "kwargs": {"action_dim": 2, "image_size": 16, "state_dim": 4}})
    spec["env"]["kwargs"] = {"action_dim": 2, "state_dim": 4, "success_steps": 3, "success_tol": 0.2}
    path = write(tmp_path / "toy.yaml", spec)
    first, again, other = train(path, 3), train(path, 3), train(path, 4)
    assert first[0][1] == "3" and len(first[1]) == 3  # 3 batches, each followed by a weight update
    assert first[2] == {"sha256": first[0][0], "count": 3}  # the report's digest is the one printed
    assert again == first  # batches, weights after every update, losses: bit for bit
    assert other[0][0] != first[0][0] and other[0][2] != first[0][2] and other[1] != first[1]
