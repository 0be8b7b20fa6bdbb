"""End to end: ``topo launch`` builds real LIBERO workers, on the EGL device ids the spec names, and collects a batch.

``examples/libero_cpu.yaml`` (2 x 2, TinyVLA in each subcollector) runs in tests/libero/test_train_libero.py:
the same launch, with the trainer pushing weights; its report is checked there as this file checked it."""
import json
import os
import subprocess
import sys

import pytest

from tests import preimported
from tests.libero.libero_helpers import ROOT, needs_libero

pytestmark = [pytest.mark.libero, pytest.mark.slow, needs_libero]


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
    proc = preimported.run([sys.executable, "-m", "topo.cli", "launch", str(spec), "--report", str(report_dir),
                           "--batches", "1"], capture_output=True, text=True, timeout=900, cwd=ROOT,
                           stdin=subprocess.DEVNULL, env={**os.environ, "MUJOCO_GL": "egl"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    devices = json.loads((report_dir / "summary.json").read_text())["render_devices"]
    got = sorted((d["planned"], d["numbering"], d["egl_device"], d["fallback"], d["workers"]) for d in devices)
    assert got == [(0, "egl", 0, None, 1), (1, "egl", 0, "1,0", 1)]
    assert "  render: egl egl 0 (no CUDA device), llvmpipe" in proc.stdout
    assert "  render: egl egl 1 -> egl 0 with CUDA_VISIBLE_DEVICES=1,0 (device-zero fallback), llvmpipe" in proc.stdout
