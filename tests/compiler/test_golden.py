"""The 5 x 64 dry-run, byte for byte, and what that plan must say. Regenerate with TOPO_UPDATE_GOLDEN=1."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import topo
from topo.cli import main

from tests.compiler.compiler_helpers import EXAMPLES, HERE, ROOT

SPEC = "examples/libero_spatial_5x64.yaml"
GOLDEN = HERE / "golden" / "libero_spatial_5x64.txt"


def test_dry_run_golden(monkeypatch):
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(main, ["plan", SPEC, "--dry-run", "--limit", "9"], env={"COLUMNS": "120"},
                                prog_name="topo")
    assert result.exit_code == 0, result.output
    # no warning; only the code a launch of it would import, named before anything runs (docs/guides/trust.md)
    assert result.stderr == "note: launching this plan imports topo.envs.libero (env builder topo.envs.libero:build)\n"
    if os.environ.get("TOPO_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(result.stdout, encoding="utf-8")
    assert result.stdout == GOLDEN.read_text(encoding="utf-8")
    assert all(len(line) <= 120 for line in result.stdout.splitlines())


def test_golden_shape():
    """What a reader of the golden file relies on (so a regenerated golden cannot quietly drift)."""
    text = GOLDEN.read_text(encoding="utf-8")
    assert text.startswith("plan 'libero-spatial-5x64': 5 subcollector(s), 320 workers, backend libero, "
                           "start spawn/spawn")
    for c in range(5):
        assert f"subcollector {c}: 64 workers, render gpu {c} (cuda)\n" in text
    assert text.count("  ... 55 more worker(s)") == 5
    assert "tasks: 8, workers per task 40 (even)" in text
    assert "distinct instructions per subcollector: 8 in each of 5" in text
    assert "groups: 40 of 8 worker(s) each, all complete" in text
    assert "workers per render device (cuda indices): gpu 0: 64, gpu 1: 64, gpu 2: 64, gpu 3: 64, gpu 4: 64" in text


def test_5x64_instructions_and_group_blocks():
    plan = topo.compile_spec(EXAMPLES / "libero_spatial_5x64.yaml")
    assert plan["coverage"]["instructions_per_subcollector"] == [8] * 5
    for sub in plan["subcollectors"]:
        workers = sub["workers"]
        assert len({w["instruction"] for w in workers}) == 8
        assert len({w["task_id"] for w in workers}) == 8
        chunks = [workers[i:i + 8] for i in range(0, 64, 8)]
        offsets = [chunk[0]["group_id_offset"] for chunk in chunks]
        for chunk in chunks:  # 8 consecutive workers share group ids, task, init-state schedule
            assert len({(w["group_id_offset"], w["task_id"], w["init_state_mode"], w["init_state_id"])
                        for w in chunk}) == 1
        assert offsets == sorted(set(offsets))  # each block its own group, in order
        assert [o // 10**6 for o in offsets] == [(sub["index"] * 64 + 8 * k) // 8 for k in range(8)]
    every = [w["group_id_offset"] for s in plan["subcollectors"] for w in s["workers"]]
    assert len(set(every)) == 40


@pytest.mark.parametrize("example, check", [("libero_spatial_5x64.yaml", 'plan["coverage"]["workers"] == 320'),
                                            ("libero_spatial_4x80.yaml", 'plan["eval"]["episodes"] == 50')])
def test_compiling_imports_no_torch_or_simulator(example, check):
    code = textwrap.dedent(f"""
        import sys, topo
        plan = topo.compile_spec({str(EXAMPLES / example)!r})
        assert {check}
        heavy = [m for m in ("torch", "torchrl", "tensordict", "robosuite", "mujoco", "libero.libero")
                 if m in sys.modules]
        assert not heavy, heavy
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
