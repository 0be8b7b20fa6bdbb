"""End to end: ``topo launch examples/libero_cpu.yaml`` builds real LIBERO workers and collects a batch."""
import json
import os
import subprocess
import sys

import pytest

import topo

from tests.libero.libero_helpers import ROOT, needs_libero

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


EGL_SPEC = """
version: 1
env:
  backend: libero
  kwargs:
    task_suite: libero_spatial
    camera_height: 64
    camera_width: 64
    max_episode_steps: 64
    env_kwargs: {hard_reset: false, camera_names: [agentview]}
topology: {subcollectors: 2, workers_per_subcollector: 1}
assignment:
  tasks: 0-1
  init_states: {mode: cycle}
  render_devices: {ids: [0, 1], numbering: egl, device_zero_fallback: true}
launch: {startup_timeout: 600}
"""


def test_launch_with_egl_ids_and_the_device_zero_fallback(tmp_path):
    """The recipe's numbering end to end on this host's one (Mesa) EGL device: EGL 0 as it is, EGL 1 through the
    fallback; the report says which numbering each worker resolved."""
    spec, report_dir = tmp_path / "egl.yaml", tmp_path / "report"
    spec.write_text(EGL_SPEC)
    proc = subprocess.run([sys.executable, "-m", "topo.cli", "launch", str(spec), "--report", str(report_dir),
                           "--batches", "1"], capture_output=True, text=True, timeout=900, cwd=ROOT,
                          stdin=subprocess.DEVNULL, env={**os.environ, "MUJOCO_GL": "egl"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    devices = json.loads((report_dir / "summary.json").read_text())["render_devices"]
    got = sorted((d["planned"], d["numbering"], d["egl_device"], d["fallback"], d["workers"]) for d in devices)
    assert got == [(0, "egl", 0, None, 1), (1, "egl", 0, "1,0", 1)]
    assert "  render: egl egl 0 (no CUDA device), llvmpipe" in proc.stdout
    assert "  render: egl egl 1 -> egl 0 with CUDA_VISIBLE_DEVICES=1,0 (device-zero fallback), llvmpipe" in proc.stdout
