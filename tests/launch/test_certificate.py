"""Evaluation a third party can check, on real processes (toy env, TinyVLA): two checkpoints on the same episodes
(``--against``), the certificate every eval writes, and ``topo eval verify`` passing on it, failing on an edited
outcome (digest recomputed) with the episode named, refusing what is not the certified spec or checkpoint.

One module-scoped evaluation (two checkpoints, 24 paired episodes) is shared; each verify is a run of its own."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch.launch_helpers import LAUNCH_LIMITS, guarded, subprocess_env, write
from topo.launch.evaluation import certificate

pytestmark = pytest.mark.slow

SPEC = {
    "version": 1, "name": "toy-paired",
    "env": {"backend": "toy", "kwargs": {"action_dim": 2, "state_dim": 4, "success_steps": 3, "success_tol": 0.2}},
    "topology": {"subcollectors": 1, "workers_per_subcollector": 2},
    "assignment": {"tasks": "0-1", "seeds": {"base": 100}},
    "launch": dict(LAUNCH_LIMITS),
    "policy": {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 2, "image_size": 16, "state_dim": 4}},
    "eval": {"tasks": "4-5", "trials": 12, "workers": 2, "max_episode_steps": 8, "seeds": {"base": 1000}},
}


def topo_(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return guarded([sys.executable, "-m", "topo", *args], env=subprocess_env(), cwd=folder)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    import torch

    from topo.policies.tinyvla import make

    folder = tmp_path_factory.mktemp("paired")
    write(folder / "spec.yaml", SPEC)
    for name, seed in (("a.pt", 1), ("b.pt", 0)):  # two real weight sets: another init, the factory's own
        torch.save(make(action_dim=2, image_size=16, state_dim=4, seed=seed).state_dict(), folder / name)
    done = topo_(folder, "eval", "spec.yaml", "--weights", "a.pt", "--against", "b.pt", "--detect", "0.1",
                 "--report", "out", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    return folder, done.stdout


def test_two_checkpoints_are_compared_on_the_same_episodes_as_an_independent_computation_says(evaluated):
    from scipy.stats import binomtest

    folder, out = evaluated
    cmp = json.loads((folder / "out" / "eval" / "comparison.json").read_text())
    rounds = [json.loads((folder / "out" / "eval" / f"round-00{i}.json").read_text()) for i in (1, 2)]
    a, b = ([e["success"] for e in r["episodes_detail"]] for r in rounds)
    assert [(e["episode"], e["seed"]) for e in rounds[0]["episodes_detail"]] \
        == [(e["episode"], e["seed"]) for e in rounds[1]["episodes_detail"]] == [(i, 1000 + i) for i in range(24)]
    a_only, b_only = sum(x and not y for x, y in zip(a, b)), sum(y and not x for x, y in zip(a, b))
    o = cmp["overall"]
    assert o["pairs"] == 24 and o["discordant"] == {"a_only": a_only, "b_only": b_only}
    assert o["difference"] == round((a_only - b_only) / 24, 4)
    expected = binomtest(a_only, a_only + b_only, 0.5).pvalue if a_only + b_only else 1.0
    assert math.isclose(o["mcnemar_p"], expected, rel_tol=1e-12)
    assert o["ci95"][0] <= o["difference"] <= o["ci95"][1]
    assert [t["task_id"] for t in cmp["per_task"]] == [4, 5] and sum(t["pairs"] for t in cmp["per_task"]) == 24
    assert o["detect"]["enough"] is (24 >= o["detect"]["pairs_needed"])
    assert "McNemar p" in out and "paired episodes" in out


def test_the_certificate_names_what_ran_and_every_episode(evaluated):
    folder, _ = evaluated
    cert = certificate.read(str(folder / "out" / "certificate.json"))
    assert cert["spec"]["path"] == "spec.yaml" and len(cert["runs"]) == 2
    assert [r["weights"]["path"] for r in cert["runs"]] == ["a.pt", "b.pt"]
    assert cert["runs"][0]["weights"]["sha256"] == certificate.sha256_file(str(folder / "a.pt"))
    assert {"topo", "torch", "torchrl", "mujoco", "robosuite"} <= set(cert["versions"]) and cert["host"]["cpu"]
    first = cert["runs"][0]["episodes"][0]
    assert {k: first[k] for k in certificate.IDENTITY} == {"episode": 0, "task_id": 4, "init_state_id": None,
                                                            "seed": 1000, "trial": 0}
    assert first["episode_id"].startswith("eval-w") and isinstance(first["checksum"], float)


def test_verify_passes_on_a_sample_and_fails_naming_an_edited_episode(evaluated, tmp_path):
    """Long: each `topo eval verify` is a run of its own (eval workers rebuilt, the sampled episodes run again with
    each checkpoint's weights): two of them here."""
    folder, _ = evaluated
    ok = topo_(folder, "eval", "verify", "out/certificate.json", "--sample", "4", "--seed", "5", "--quiet")
    assert ok.returncode == 0 and "verified: every episode identical" in ok.stdout, ok.stdout + ok.stderr
    assert ok.stdout.count(": identical") == 8  # 4 episodes x 2 checkpoints
    cert = json.loads((folder / "out" / "certificate.json").read_text())
    edited = cert["runs"][1]["episodes"][7]
    edited["checksum"] += 1.0
    (folder / "edited.json").write_text(json.dumps(certificate.seal(cert)))
    bad = topo_(folder, "eval", "verify", "edited.json", "--quiet")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (line,) = [x for x in bad.stdout.splitlines() if "DIFFERS" in x]
    assert line.startswith("  b.pt: episode 7 ") and "DIFFERS in checksum" in line


def test_verify_refuses_an_edited_certificate_another_spec_and_another_checkpoint(evaluated, tmp_path):
    folder, _ = evaluated
    work = tmp_path / "w"
    shutil.copytree(folder, work, ignore=shutil.ignore_patterns("topo-run-*"))
    cert = json.loads((work / "out" / "certificate.json").read_text())
    cert["runs"][0]["episodes"][0]["success"] = not cert["runs"][0]["episodes"][0]["success"]
    (work / "unsealed.json").write_text(json.dumps(cert))
    cases = {"unsealed.json": "digest does not match"}
    (work / "b.pt").write_bytes((work / "a.pt").read_bytes())
    cases["out/certificate.json"] = "is not the one it certifies"
    for name, says in cases.items():
        done = topo_(work, "eval", "verify", name, "--quiet")
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    write(work / "spec.yaml", {**SPEC, "name": "another"})
    done = topo_(work, "eval", "verify", "out/certificate.json", "--quiet")
    assert done.returncode == 2 and "a certificate of another spec" in done.stderr, done.stderr
