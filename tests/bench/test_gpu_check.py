"""scripts/gpu-check (benchmarks/gpu_check.py) without a GPU: its "no GPU" exit, and the logic its JSON is built
from: the largest topology from memory figures, the render devices' check, nvidia-smi's output read (a stand-in
nvidia-smi), and the specs it launches on a GPU, compiled here."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import topo

ROOT = Path(__file__).resolve().parent.parent.parent
_spec = importlib.util.spec_from_file_location("gpu_check_script", ROOT / "benchmarks" / "gpu_check.py")
gc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gc)


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi"):
        return True
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(_has_gpu(), reason="a GPU is here: scripts/gpu-check would run the whole check")
def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([str(ROOT / "scripts" / "gpu-check"), "--out", str(out)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no GPU (nvidia-smi: not found; torch" in done.stdout and "nothing to check" in done.stdout
    assert not out.exists()  # nothing written, nothing launched


def test_no_gpu_reason():
    none = {"nvidia_smi": {"status": "not found", "gpus": []}, "torch": {"version": "2.13.0+cpu", "cuda_devices": 0}}
    assert gc.no_gpu_reason(none) == "nvidia-smi: not found; torch 2.13.0+cpu: no CUDA device"
    broken = {"nvidia_smi": {"status": "not found", "gpus": []}, "torch": {"error": "torch failed: ImportError"}}
    assert gc.no_gpu_reason(broken) == "nvidia-smi: not found; torch ?: torch failed: ImportError"
    smi_only = {"nvidia_smi": {"status": "1 GPU(s)", "gpus": [{"index": 0}]}, "torch": none["torch"]}
    assert gc.no_gpu_reason(smi_only) is None  # a CPU torch on a GPU: the check runs, the CUDA steps say why they fail
    torch_only = {"nvidia_smi": {"status": "not found", "gpus": []}, "torch": {"version": "x", "cuda_devices": 1}}
    assert gc.no_gpu_reason(torch_only) is None


def _largest(**kw):
    figures = dict(subcollectors=4, host_available_gb=120.0, worker_gb=1.6, gpu_free_gb=79.0, gpu_worker_gb=0.3,
                   max_workers=96, gpu_process_gb=0.5)
    return gc.largest_topology(**{**figures, **kw})


def test_the_largest_topology_on_an_h100_host_is_bound_by_host_memory():
    got = _largest()
    # 0.9 x 120 = 108 GB, less 9 processes x 0.4 = 104.4 GB, over 1.6 GB = 65.25 workers: 16 per subcollector
    assert got["limits_per_subcollector"]["host memory"] == 16
    assert (got["subcollectors"], got["workers_per_subcollector"], got["workers"]) == (4, 16, 64)
    assert got["bound_by"] == "host memory"
    assert "90% of 120.0 GB available" in got["arithmetic"] and "79.0 GB free" in got["arithmetic"]


def test_the_largest_topology_by_gpu_memory_and_by_the_cap():
    got = _largest(gpu_free_gb=10.0, gpu_worker_gb=0.5)  # (9 - 2) / 0.5 / 4 = 3.5 -> 3 -> even: 2
    assert (got["workers_per_subcollector"], got["bound_by"]) == (2, "gpu memory")
    got = _largest(max_workers=20)  # 5 per subcollector, rounded down to the group size's multiple
    assert (got["workers_per_subcollector"], got["bound_by"]) == (4, "cap")
    got = _largest(gpu_free_gb=None, gpu_worker_gb=None)  # CPU rendering: the GPU limits nothing
    assert "gpu memory" not in got["limits_per_subcollector"] and got["workers"] == 64


def test_the_largest_topology_takes_fewer_subcollectors_before_nothing():
    got = _largest(host_available_gb=8.0)  # 7.2 - 3.6 = 3.6 GB: 2 workers, not 2 in each of 4 subcollectors
    assert (got["subcollectors"], got["workers_per_subcollector"]) == (1, 2)
    got = _largest(host_available_gb=2.0)
    assert (got["subcollectors"], got["workers_per_subcollector"], got["workers"]) == (1, 0, 0)


def test_the_render_check_reads_what_each_worker_resolved():
    gpu = {"gl": "egl", "numbering": "cuda", "cuda_device": 0, "egl_device": 1, "fallback": None,
           "renderer": "NVIDIA H100 80GB HBM3/PCIe/SSE2", "planned": 0, "workers": 4}
    ok = gc.render_check([gpu], 4, 0)
    assert ok["ok"] and ok["egl_devices"] == [1] and ok["renderers"] == ["NVIDIA H100 80GB HBM3/PCIe/SSE2"]
    soft = gc.render_check([{**gpu, "renderer": "llvmpipe (LLVM 15.0.6, 256 bits)"}], 4, 0)
    assert not soft["ok"] and "not the GPU" in soft["problems"][0]
    elsewhere = gc.render_check([{**gpu, "cuda_device": 1, "workers": 3}], 4, 0)
    assert not elsewhere["ok"] and elsewhere["problems"][0] == "3 of 4 workers recorded a render device"
    assert "planned CUDA 0" in elsewhere["problems"][1]
    assert not gc.render_check([{**gpu, "renderer": None}], 4, 0)["ok"]  # no context current: nothing proven
    cpu = {"gl": "egl", "numbering": None, "cuda_device": None, "egl_device": None, "renderer": "llvmpipe", "workers": 2}
    assert gc.render_check([cpu], 2, None)["ok"]
    assert not gc.render_check([], 2, None)["ok"]


TABLE = """\
+-----------------------------------------------------------------------------------------+
| Processes:                                                                              |
|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |
|        ID   ID                                                               Usage      |
|=========================================================================================|
|    0   N/A  N/A          123456      C   python                                  500MiB |
|    0   N/A  N/A            2345    C+G   /usr/bin/python3 -c from multi...       220MiB |
|    0   N/A  N/A            2346      G   python3                                    N/A |
+-----------------------------------------------------------------------------------------+
"""


def test_nvidia_smi_output_is_read():
    assert gc.parse_gpus("0, NVIDIA H100 80GB HBM3, 81559, 4, 580.159.04\n") == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mb": 81559.0, "memory_used_mb": 4.0,
         "driver": "580.159.04"}]
    assert gc.parse_processes(TABLE) == {123456: {"type": "C", "mb": 500.0}, 2345: {"type": "C+G", "mb": 220.0},
                                         2346: {"type": "G", "mb": None}}


def test_the_sampler_reads_a_stand_in_nvidia_smi(tmp_path, monkeypatch):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\ncase \"$2\" in --query-gpu=*) echo '1500, 81559, 12'; exit 0;; esac\n"
                    f"cat <<'T'\n{TABLE}T\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    with gc.GpuSampler(period=0.05) as sampler:
        import time

        time.sleep(0.5)
    got = sampler.result({2345: "inference server", 2346: "env worker"})
    assert got["peak_used_mb"] == 1500.0 and got["total_mb"] == 81559.0 and got["samples"] >= 1
    assert got["on_gpu_by_role"] == {"not this run's": 1, "inference server": 1, "env worker": 1}
    assert {p["pid"]: p["type"] for p in got["processes"]} == {123456: "C", 2345: "C+G", 2346: "G"}
    assert json.dumps(got)


@pytest.mark.parametrize("mode,device", [("async", "cuda"), ("multi", "cuda"), ("multi", None)])
def test_the_specs_it_launches_on_a_gpu_compile_here(tmp_path, mode, device):
    spec = gc.spec_of(f"gpu-check-{mode}", 4, 16, camera=256, render_gpu=0, policy_device=device, mode=mode)
    plan = topo.compile_spec(gc.write_spec(spec, str(tmp_path)))
    rows = [row for sub in plan["subcollectors"] for row in sub["workers"]]
    assert len(rows) == 64 and {row["render_gpu"] for row in rows} == {0}
    assert (plan.get("policy") or {}).get("device") == device
    assert plan["collector"].get("mode", "multi") == mode
