"""``topo doctor``: its checks on given facts, its probes' containment, and its output on this host."""
import json
import shutil
import subprocess
import sys

import pytest

from topo.backends import get_backend
from topo.backends.libero import check_config as check_libero_config
from topo.checks import FAIL, OK, WARN
from topo.doctor.host import _finish, check_devices, check_gl, check_memory

from tests.libero.libero_helpers import ROOT, needs_libero, run_python

SPEC = """
version: 1
env:
  backend: libero
  kwargs: {{task_suite: libero_spatial, camera_height: 64, camera_width: 64, env_kwargs: {{hard_reset: false}}}}
topology: {{subcollectors: {subs}, workers_per_subcollector: 2}}
assignment:
  tasks: 0-1
  init_states: {{mode: cycle}}
{extra}
"""


def plan(workers=(2, 2)):
    return {"subcollectors": [{"num_workers": n} for n in workers]}


def test_memory_fits_warns_and_fails():
    assert check_memory(plan(), 20.0, get_backend("libero")).status == OK  # 4 x 2.0 + 3 x 0.4 = 9.2 GB
    warn = check_memory(plan(), 10.0, get_backend("libero"))
    assert warn.status == WARN and "~9.2 GB needed" in warn.detail
    fail = check_memory(plan(workers=(64,) * 5), 22.0, get_backend("libero"))
    assert fail.status == FAIL and "320 workers x 2.0 GB" in fail.detail and "fits about 9 workers" in fail.hint
    toy = check_memory(plan((8, 8)), 22.0, get_backend("toy"))  # toy workers are plain torch + torchrl processes
    assert toy.status == OK and "16 workers x 0.4 GB" in toy.detail


def test_render_devices():
    assert check_devices([], None, None).status == OK
    no_gpu = check_devices([0], {"devices": [None]}, None)
    assert no_gpu.status == FAIL and "no NVIDIA GPU" in no_gpu.detail and "none of them a CUDA GPU" in no_gpu.detail
    two = ["GPU 0: A", "GPU 1: B"]
    assert check_devices([2], {"devices": [1, 0]}, two).status == FAIL  # only 2 visible
    unmapped = check_devices([1], {"devices": [0, None]}, two)
    assert unmapped.status == FAIL and "CUDA device(s) [1]" in unmapped.detail
    gl = {0: {"renderer": "NVIDIA H200/PCIe/SSE2"}, 1: {"renderer": "NVIDIA H200/PCIe/SSE2"}}
    good = check_devices([0, 1], {"devices": [None, 1, 0]}, two, gl)
    assert good.status == OK and "CUDA 0 -> EGL 2" in good.detail and "CUDA 1 -> EGL 1" in good.detail
    soft = check_devices([0], {"devices": [0]}, two, {0: {"renderer": "llvmpipe (LLVM 15)"}})
    assert soft.status == WARN
    broken = check_devices([0], {"devices": [0]}, two, {0: {"error": "EGL_BAD_MATCH"}})
    assert broken.status == FAIL and "EGL_BAD_MATCH" in broken.detail


def test_gl_failure_names_the_missing_library():
    osmesa = check_gl({"gl": "osmesa", "error": "AttributeError: 'NoneType' object has no attribute 'glGetError'"})
    assert osmesa.status == FAIL and "libosmesa6" in osmesa.hint
    assert "software" in check_gl({"gl": "egl", "renderer": "llvmpipe (LLVM 15.0.6, 256 bits)"}).detail


@needs_libero
def test_libero_config_trap_is_caught(tmp_path):
    assert check_libero_config(str(tmp_path), None).status == OK  # no config yet: workers seed it
    (tmp_path / "config.yaml").write_text(f"assets: '{tmp_path}'\n")
    trap = check_libero_config(str(tmp_path), None)
    assert trap.status == FAIL and str(tmp_path / "config.yaml") in trap.hint
    assert check_libero_config(None, str(tmp_path)).status == FAIL


def test_probes_are_contained():
    hang = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert "timed out" in _finish(hang, 0.5)["error"]
    crash = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "killed by signal 11" in _finish(crash, 30)["error"]


def test_importing_doctor_imports_no_torch():
    proc = run_python("import sys, topo.doctor.host; assert 'torch' not in sys.modules and 'numpy' not in sys.modules")
    assert proc.returncode == 0, proc.stderr


def doctor(tmp_path, extra="", subs=2, *args):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(subs=subs, extra=extra))
    return subprocess.run([sys.executable, "-m", "topo.cli", "doctor", str(spec), *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)


@needs_libero
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="expects a host without NVIDIA GPU")
def test_doctor_on_this_cpu_host(tmp_path):
    """Long: two `topo doctor` runs on a LIBERO spec, each probing this host in child processes (LIBERO's and
    torchrl's imports, a GL context per render GPU asked for)."""
    ok = doctor(tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    assert [line.split()[:2] for line in lines[1:-1]] == [
        ["ok", "backend"], ["ok", "imports"], ["ok", "torchrl"], ["ok", "gl"], ["ok", "render-gpus"], ["ok", "libero-tasks"], ["ok", "libero-assets"],
        ["ok", "memory"]]
    assert "llvmpipe" in ok.stdout and lines[-1].startswith("ready to launch")

    gpus = doctor(tmp_path, "  render_gpus: [0, 1]", 2, "--format", "json")
    assert gpus.returncode == 1
    report = json.loads(gpus.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert report["ok"] is False and by_name["render-gpus"]["status"] == FAIL
    assert "no NVIDIA GPU" in by_name["render-gpus"]["detail"] and by_name["render-gpus"]["hint"]
    assert by_name["render-numbering"]["status"] == OK and "none of the" in by_name["render-numbering"]["detail"]

    # EGL ids, as torchrl's vla_grpo numbers them: EGL 0 is this host's Mesa device; 1 is beyond it (fallback)
    egl = doctor(tmp_path, "  render_devices: {ids: [0, 1], numbering: egl, device_zero_fallback: true}", 2,
                 "--format", "json")
    assert egl.returncode == 0, egl.stdout + egl.stderr
    by_name = {c["name"]: c for c in json.loads(egl.stdout)["checks"]}
    devices = by_name["render-gpus"]
    assert devices["status"] == WARN and "render in software" in devices["detail"]
    assert "EGL 0 = not a CUDA GPU (llvmpipe" in devices["detail"]
    assert "EGL 1 -> EGL 0 with CUDA_VISIBLE_DEVICES=1,0 (device-zero fallback) (llvmpipe" in devices["detail"]
    assert by_name["render-numbering"]["status"] == OK
