"""A GPU check, ready to run: real LIBERO rendering with EGL on the GPU, TinyVLA on CUDA in async and sync mode,
and the largest LIBERO topology the memory allows; one JSON.

    scripts/gpu-check                # a machine with a CUDA GPU (after bash scripts/setup): at most 9 min, one JSON
    scripts/gpu-check --quick        # smaller topologies, shorter measures: at most 5 min
    scripts/gpu-check --cpu-dry      # the same steps on CPU (Mesa EGL, policy on cpu), 1 x 2: every code path, here

Elsewhere (no GPU seen by ``nvidia-smi`` nor by torch) it prints ``no GPU (...): nothing to check`` and exits 0,
writing nothing. On a GPU, every step is a real topo run (``topo.collector`` in a child process of its own, with
``MUJOCO_GL=egl``), and a step that fails is recorded in the JSON (its error, its log's tail) before the next:

1. ``render``: real LIBERO 1 x 4 (``--quick``: 1 x 2), ``render_gpus: [0]``, random actions. Every worker's
   render device as it resolved it inside the worker (the report's ``render_devices``: the EGL device, the CUDA
   index it shows, the GL renderer string of its context) must be GPU 0 with a hardware renderer; the GPU's
   memory per worker is read from ``nvidia-smi`` (its peak over the run, less the baseline). When it fails,
   ``topo doctor`` of the same spec says why (GL, render devices, imports).
2. ``policy_modes``: LIBERO 2 x 4 (``--quick``: 1 x 4) rendered on GPU 0, TinyVLA with ``policy.device: cuda``:
   ``collector.mode: async`` (one inference server on CUDA) then multi mode (a copy on CUDA per subcollector),
   side by side: time to ready, frames/s over ``--seconds`` after two warm-up batches, the policy's device as
   the report states it, GPU memory, the processes ``nvidia-smi`` shows on the GPU (each named by its role).
3. ``largest``: the most workers this host's memory and the GPU's allow (:func:`largest_topology`: host memory
   from the render step's measured worker peak against MemAvailable, GPU memory from the render and policy
   steps' figures against the GPU's free memory, at most ``--max-per-core`` workers per core and ``--max-workers``
   in all), checked by
   ``topo plan --estimate`` (its probe; a refusal shrinks it to what the estimate says fits). Launched in multi
   mode with TinyVLA on CUDA: ready time against the estimate's lower bound (``ready.bound_s``: max(chain,
   work / cores), docs/benchmarks.md) and its prediction, frames/s against the predicted, every worker's render
   device checked as in step 1.

Output: ``benchmarks/results/gpu_check.json`` (``--cpu-dry``: ``gpu_check_cpu_dry.json``; ``--out``), written
after every step. Exit 0 when every step passed, 1 otherwise. The whole is kept under ``--budget`` seconds
(default 540; ``--quick`` 300): each step's timeout is what is left, and a step with too little left is recorded
as skipped (failed).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASE_SPEC = os.path.join(ROOT, "examples", "libero_cpu.yaml")
RESULTS = os.path.join(HERE, "results")
USABLE = 0.9  # the share of a memory a topology may take (topo.estimate.model.USABLE)
PROCESS_GB = 0.4  # a bare process with torch + torchrl (topo.estimate.model.PROCESS_GB)
DECLARED_WORKER_GB = 2.0  # the libero backend's memory_per_worker_gb, when no worker was measured
GPU_PROCESS_GB = 0.5  # a CUDA context and TinyVLA in one process, when not measured (CUDA_CONTEXT_GB's high end)
GPU_WORKER_GB = 0.5  # one worker's EGL context and textures, when not measured
STEPS_PER_BATCH = 4  # frames per batch: every worker's steps x this
WARMUP_BATCHES = 2
KILL_GRACE_S = 30  # a case past its timeout: SIGTERM (topo's teardown), then SIGKILL to its session after this
SOFTWARE = ("llvmpipe", "softpipe", "swrast")  # GL renderers that run on the CPU (topo.doctor.host._software)
EGL_VENDOR_FILES = ("/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json",
                    "/usr/share/glvnd/egl_vendor.d/10_nvidia.json")


# -- pure: what the figures say (tests/bench/test_gpu_check.py) ----------------------------------------------------

def largest_topology(*, subcollectors: int, host_available_gb: float, worker_gb: float, gpu_free_gb: float | None,
                     gpu_worker_gb: float | None, max_workers: int, process_gb: float = PROCESS_GB,
                     policy_gb: float = 0.0, gpu_process_gb: float = GPU_PROCESS_GB, usable: float = USABLE,
                     multiple: int = 2) -> dict[str, Any]:
    """The most workers per subcollector for ``subcollectors`` subcollectors in multi mode, a multiple of ``multiple``
    (the spec's group size), limited by the host's memory, the GPU's and ``max_workers`` in all.

    Host: ``usable`` x available >= workers x ``worker_gb`` + processes x ``process_gb`` + copies x ``policy_gb``, the
    processes being each subcollector, its forkserver and the trainer, the copies each subcollector's and the
    trainer's (as ``topo plan --estimate`` counts them). GPU (``gpu_free_gb`` None: not limited): ``usable`` x free
    >= workers x ``gpu_worker_gb`` (an EGL context each) + subcollectors x ``gpu_process_gb`` (a CUDA context and
    the policy each). Fewer subcollectors are tried when not one multiple fits each. Returns the shape
    (``workers_per_subcollector`` 0 when nothing fits), ``bound_by`` (``host memory``, ``gpu memory`` or ``cap``)
    and each limit in workers per subcollector."""
    for s in range(max(1, subcollectors), 0, -1):
        host_left = usable * host_available_gb - (2 * s + 1) * process_gb - (s + 1) * policy_gb
        limits = {"host memory": math.floor(max(0.0, host_left) / worker_gb / s),
                  "cap": max_workers // s}
        if gpu_free_gb is not None:
            gpu_left = usable * gpu_free_gb - s * gpu_process_gb
            limits["gpu memory"] = math.floor(max(0.0, gpu_left) / max(gpu_worker_gb or GPU_WORKER_GB, 1e-6) / s)
        per = min(limits.values())
        per -= per % multiple
        if per >= multiple or s == 1:
            bound_by = min(limits, key=lambda k: (limits[k], k != "cap"))
            arithmetic = (f"host: {usable:.0%} of {host_available_gb:.1f} GB available, less {2 * s + 1} processes x "
                          f"{process_gb:.2f} GB, over {worker_gb:.2f} GB a worker")
            if gpu_free_gb is not None:
                arithmetic += (f"; GPU: {usable:.0%} of {gpu_free_gb:.1f} GB free, less {s} x {gpu_process_gb:.2f} GB, "
                               f"over {gpu_worker_gb or GPU_WORKER_GB:.2f} GB a worker")
            arithmetic += f"; at most {max_workers} workers"
            return {"subcollectors": s, "workers_per_subcollector": max(per, 0), "workers": s * max(per, 0),
                    "bound_by": bound_by, "limits_per_subcollector": limits, "arithmetic": arithmetic}
    raise AssertionError("unreachable")


def render_check(devices: list[dict] | None, workers: int, gpu: int | None) -> dict[str, Any]:
    """Whether every one of ``workers`` workers rendered where it was planned, from the report's ``render_devices``
    (what each builder resolved inside its worker, grouped). ``gpu``: the CUDA index planned (EGL on that GPU, a
    hardware renderer); None: CPU rendering (no EGL device set)."""
    devices = devices or []
    counted = sum(d.get("workers", 0) for d in devices)
    problems = []
    if counted != workers:
        problems.append(f"{counted} of {workers} workers recorded a render device")
    for d in devices:
        renderer = d.get("renderer")
        software = renderer is not None and any(s in renderer.lower() for s in SOFTWARE)
        if gpu is None:
            if d.get("egl_device") is not None:
                problems.append(f"{d.get('workers')} worker(s) on EGL device {d.get('egl_device')}, none planned")
            continue
        if d.get("cuda_device") != gpu or d.get("egl_device") is None:
            problems.append(f"{d.get('workers')} worker(s) resolved CUDA {d.get('cuda_device')} / EGL "
                            f"{d.get('egl_device')}, planned CUDA {gpu}")
        if d.get("gl") != "egl":
            problems.append(f"{d.get('workers')} worker(s) with MUJOCO_GL={d.get('gl')!r}, not egl")
        if renderer is None or software:
            problems.append(f"{d.get('workers')} worker(s) rendered with {renderer!r}, not the GPU")
    return {"ok": not problems, "problems": problems, "workers_checked": counted,
            "renderers": sorted({d.get("renderer") or "?" for d in devices}),
            "egl_devices": sorted({d["egl_device"] for d in devices if d.get("egl_device") is not None})}


def parse_gpus(text: str) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader,nounits``."""
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5 and parts[0].isdigit():
            out.append({"index": int(parts[0]), "name": parts[1], "memory_total_mb": _number(parts[2]),
                        "memory_used_mb": _number(parts[3]), "driver": parts[4]})
    return out


PROCESS_ROW = re.compile(r"^\|\s*(\d+)\s+\S+\s+\S+\s+(\d+)\s+(C\+G|C|G)\s+.*?\s(\d+MiB|N/A)\s*\|\s*$")


def parse_processes(text: str) -> dict[int, dict[str, Any]]:
    """The processes table of plain ``nvidia-smi`` (compute and graphics: an EGL context is ``G``): by pid, its
    type and GPU memory (MB; None where the driver says N/A)."""
    out = {}
    for line in text.splitlines():
        m = PROCESS_ROW.match(line.strip())
        if m:
            out[int(m.group(2))] = {"type": m.group(3), "mb": float(m.group(4)[:-3]) if m.group(4) != "N/A" else None}
    return out


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def no_gpu_reason(found: dict[str, Any]) -> str | None:
    """Why there is nothing to check (None: a GPU is there), from :func:`detect`'s findings."""
    if found["nvidia_smi"]["gpus"] or found["torch"].get("cuda_devices"):
        return None
    torch = found["torch"]
    seen = [f"nvidia-smi: {found['nvidia_smi']['status']}",
            f"torch {torch.get('version', '?')}: " + ("no CUDA device" if "version" in torch else torch.get("error", "?"))]
    return "; ".join(seen)


def summary(steps: dict[str, dict]) -> dict[str, Any]:
    """The headline figures of the steps: ready against its bound, frames/s sync and async, GPU memory."""
    render, modes, largest = steps.get("render") or {}, steps.get("policy_modes") or {}, steps.get("largest") or {}
    runs = modes.get("runs") or {}
    runs_of = [render.get("run") or {}, *runs.values(), largest.get("run") or {}]
    peaks = [p for p in ((r.get("gpu") or {}).get("peak_used_mb") for r in runs_of) if p is not None]
    return {
        "render": {"ok": render.get("ok"), "renderers": (render.get("render_check") or {}).get("renderers")},
        "frames_per_s": {mode: (runs.get(mode) or {}).get("frames_per_s") for mode in ("async", "sync")},
        "async_over_sync": modes.get("async_over_sync"),
        "largest": {"shape": largest.get("shape"), "bound_by": (largest.get("choice") or {}).get("bound_by"),
                    "ready_s": largest.get("ready_s"), "ready_bound_s": largest.get("ready_bound_s"),
                    "ready_over_bound": largest.get("ready_over_bound"),
                    "ready_predicted_s": largest.get("ready_predicted_s"), "frames_per_s": largest.get("frames_per_s"),
                    "frames_per_s_predicted": largest.get("frames_per_s_predicted")},
        "gpu_memory_peak_mb": max(peaks) if peaks else None,
        "gpu_memory_per_worker_mb": render.get("gpu_mb_per_worker"),
    }


# -- the machine --------------------------------------------------------------------------------------------------

def _run(argv: list[str], timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None


def nvidia_smi() -> dict[str, Any]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"status": "not found", "gpus": []}
    done = _run([exe, "--query-gpu=index,name,memory.total,memory.used,driver_version",
                 "--format=csv,noheader,nounits"])
    if done is None or done.returncode != 0:
        return {"status": f"failed ({(done.stderr or done.stdout).strip()[:200] if done else 'timed out'})", "gpus": []}
    gpus = parse_gpus(done.stdout)
    return {"status": f"{len(gpus)} GPU(s)" if gpus else "no GPU listed", "gpus": gpus}


TORCH_PROBE = ("import json, torch; ok = torch.cuda.is_available(); n = torch.cuda.device_count() if ok else 0; "
               "print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, 'cuda_devices': n, "
               "'names': [torch.cuda.get_device_name(i) for i in range(n)], "
               "'memory': [torch.cuda.mem_get_info(i) for i in range(n)]}))")


def torch_cuda() -> dict[str, Any]:
    done = _run([sys.executable, "-c", TORCH_PROBE], timeout=120)
    if done is None or done.returncode != 0:
        return {"error": "torch failed: " + ((done.stderr or "")[-300:] if done else "timed out")}
    return json.loads(done.stdout.strip().splitlines()[-1])


EGL_PROBE = "import json; from topo.runtime.gl import egl_devices; print(json.dumps(egl_devices()))"


def egl(env: dict) -> dict[str, Any]:
    """The EGL devices a worker would see (each as the CUDA index it shows), with ``env``."""
    done = _run([sys.executable, "-c", EGL_PROBE], timeout=60, env=env)
    if done is None or done.returncode != 0:
        return {"devices": None, "error": ((done.stderr or "")[-300:] if done else "timed out")}
    return {"devices": json.loads(done.stdout.strip().splitlines()[-1])}


def detect() -> dict[str, Any]:
    return {"nvidia_smi": nvidia_smi(), "torch": torch_cuda(),
            "dev_nvidia": sorted(p for p in os.listdir("/dev") if p.startswith("nvidia")) if os.path.isdir("/dev") else []}


def child_env(egl_vendor: str | None = None) -> dict[str, str]:
    env = {**os.environ, "MUJOCO_GL": "egl", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    if egl_vendor:
        env["__EGL_VENDOR_LIBRARY_FILENAMES"] = egl_vendor
    return env


def egl_setup(gpu: bool) -> dict[str, Any]:
    """The EGL devices the workers will see; on a GPU where none shows a CUDA device and NVIDIA's EGL vendor file
    is not found by default (some containers), the vendor file named explicitly, if that makes one show."""
    seen = egl(child_env())
    out = {"devices": seen.get("devices"), "error": seen.get("error"), "vendor_file": None}
    if gpu and not any(d is not None for d in seen.get("devices") or []) and \
            "__EGL_VENDOR_LIBRARY_FILENAMES" not in os.environ:
        for path in EGL_VENDOR_FILES:
            if os.path.exists(path):
                again = egl(child_env(path))
                if any(d is not None for d in again.get("devices") or []):
                    out.update(devices=again["devices"], error=None, vendor_file=path)
                    break
    return out


def meminfo() -> dict[str, float]:
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(value.split()[0]) / 2 ** 20  # kB -> GB
    return {"total_gb": round(out.get("MemTotal", 0.0), 2), "available_gb": round(out.get("MemAvailable", 0.0), 2)}


class GpuSampler:
    """``nvidia-smi`` read every ``period`` s in a thread: the GPU's used memory (baseline, peak), its utilisation,
    and each compute process's peak memory. Nothing when ``nvidia-smi`` is missing."""

    def __init__(self, gpu: int = 0, period: float = 0.5):
        self.exe, self.gpu, self.period = shutil.which("nvidia-smi"), gpu, period
        self.baseline = self.peak = self.total = None
        self.util_peak, self.apps, self.samples = None, {}, 0
        self._stop = threading.Event()
        self._thread = None

    def _read(self) -> tuple[float | None, float | None, float | None]:
        done = _run([self.exe, f"--id={self.gpu}", "--query-gpu=memory.used,memory.total,utilization.gpu",
                     "--format=csv,noheader,nounits"], timeout=10)
        if done is None or done.returncode != 0:
            return None, None, None
        parts = [_number(p.strip()) for p in done.stdout.strip().split(",")] + [None, None, None]
        return parts[0], parts[1], parts[2]

    def _loop(self):
        while not self._stop.is_set():
            used, total, util = self._read()
            if used is not None:
                self.samples += 1
                self.peak, self.total = max(self.peak or 0.0, used), total
                self.util_peak = max(self.util_peak or 0.0, util or 0.0)
            table = _run([self.exe, f"--id={self.gpu}"], timeout=10)
            if table is not None and table.returncode == 0:
                for pid, seen in parse_processes(table.stdout).items():
                    before = self.apps.get(pid) or {"type": seen["type"], "mb": None}
                    mb = max(m for m in (before["mb"], seen["mb"], -1.0) if m is not None)
                    self.apps[pid] = {"type": seen["type"], "mb": mb if mb >= 0 else None}
            self._stop.wait(self.period)

    def __enter__(self):
        if self.exe:
            self.baseline = self._read()[0]
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread:
            self._thread.join(15)

    def result(self, roles: dict[int, str] | None = None) -> dict[str, Any] | None:
        if not self.exe:
            return None
        roles = roles or {}
        return {"baseline_used_mb": self.baseline, "peak_used_mb": self.peak, "total_mb": self.total,
                "peak_over_baseline_mb": None if self.peak is None or self.baseline is None
                else round(self.peak - self.baseline, 1),
                "utilization_peak_pct": self.util_peak, "samples": self.samples,
                "processes": [{"pid": pid, "role": roles.get(pid, "not this run's"), "type": seen["type"],
                               "peak_mb": seen["mb"]} for pid, seen in sorted(self.apps.items())],
                "on_gpu_by_role": dict(Counter(roles.get(pid, "not this run's") for pid in self.apps))}


# -- the specs -------------------------------------------------------------------------------------------------------

def spec_of(name: str, subcollectors: int, workers: int, *, camera: int, render_gpu: int | None, policy_device: str | None,
            mode: str = "multi", startup_timeout: float = 600) -> dict[str, Any]:
    """examples/libero_cpu.yaml's env (``camera`` px, agentview only, no hard reset), reshaped; TinyVLA on
    ``policy_device`` (None: random actions); GPU ``render_gpu`` for every subcollector (None: CPU rendering)."""
    with open(BASE_SPEC) as f:
        spec = yaml.safe_load(f)
    n = subcollectors * workers
    spec["name"] = name
    spec["env"]["kwargs"].update(camera_height=camera, camera_width=camera)
    spec["topology"] = {"subcollectors": subcollectors, "workers_per_subcollector": workers}
    spec["assignment"]["tasks"] = f"0-{max(min(n // 2, 10) - 1, 0)}"  # groups of 2; libero_spatial has 10 tasks
    if render_gpu is not None:
        spec["assignment"]["render_gpus"] = [render_gpu]
    spec["collector"] = {"frames_per_batch": n * STEPS_PER_BATCH, **({"mode": "async"} if mode == "async" else {})}
    spec["launch"] = {"startup_timeout": float(startup_timeout)}
    if policy_device is None:
        spec.pop("policy", None)
    else:
        spec["policy"] = {"factory": "topo.policies.tinyvla:make", "device": policy_device,
                          "kwargs": {"action_dim": 7, "image_size": camera, "state_dim": 9}}
    return spec


def write_spec(spec: dict, folder: str) -> str:
    path = os.path.join(folder, spec["name"] + ".yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec, f, sort_keys=False)
    return path


# -- one case: a topo run in a child process -------------------------------------------------------------------------

def case_main(case_path: str) -> None:
    """In the child: ``topo.collector`` over the case's spec; ready time, frames/s over ``seconds`` after
    :data:`WARMUP_BATCHES` batches (or ``batches`` batches in all), the report; written to the case's result file."""
    from topo.runtime import gl

    gl.hold()  # as topo launch: this process builds no env and opens no GL display, before torch

    def stop(signum, frame):  # the parent's timeout: end the run through its own teardown, report written
        raise TimeoutError("stopped by scripts/gpu-check: the step's timeout passed")

    signal.signal(signal.SIGTERM, stop)
    with open(case_path) as f:
        case = json.load(f)
    out: dict[str, Any] = {"ok": False}
    run = None
    try:
        import topo

        started = time.monotonic()
        run = topo.collector(case["spec"], progress=True, report_dir=case["report_dir"], process_logs=True)
        with run:
            out["ready_wall_s"] = round(time.monotonic() - started, 2)
            frames, batches, t0 = 0, 0, None
            for i, batch in enumerate(run.collector):
                batches += 1
                if i + 1 == WARMUP_BATCHES:
                    t0 = time.monotonic()
                elif i + 1 > WARMUP_BATCHES:
                    frames += batch.numel()
                    if time.monotonic() - t0 >= case["seconds"]:
                        break
                if case.get("batches") and batches >= case["batches"]:
                    break
            took = time.monotonic() - t0 if t0 is not None else None
        out.update(ok=True, batches=batches, frames=frames, seconds=round(took, 2) if took else None,
                   frames_per_s=round(frames / took, 2) if took and frames else None)
    except BaseException as e:  # recorded; the parent reads the result file
        out["error"] = f"{type(e).__name__}: {e}"[:4000]
        out["traceback"] = traceback.format_exc()[-4000:]
    finally:
        report = run.report.data if run is not None and run.report is not None else None
        if report is not None:
            out["report"] = {k: report.get(k) for k in ("ok", "exit_code", "error", "timings_s", "render_devices",
                                                         "policy", "time_breakdown", "restarts", "not_closed")}
            out["report"]["memory"] = {k: (report.get("memory") or {}).get(k) for k in ("peak_rss_mb", "measured")}
            procs = report.get("processes") or {}
            out["report"]["processes"] = {k: procs.get(k) for k in ("trainer_pid", "server_pid", "subcollector_pids",
                                                                     "worker_pids", "left_behind", "peak")}
            out["ok"] = out["ok"] and bool(report.get("ok"))
        with open(case["result"], "w") as f:
            json.dump(out, f, indent=1, default=str)


def run_case(name: str, spec: dict, work: str, *, seconds: float, timeout: float, gpu: int | None, env: dict,
             batches: int | None = None) -> dict[str, Any]:
    """``spec`` run by :func:`case_main` in a child process of its own (killed past ``timeout``), the GPU sampled
    meanwhile. Returns the child's result with the GPU's figures, the wall time, and the log's tail on failure."""
    folder = os.path.join(work, name)
    os.makedirs(folder, exist_ok=True)
    spec["launch"]["startup_timeout"] = float(max(30, timeout - 30))
    case = {"spec": write_spec(spec, folder), "report_dir": os.path.join(folder, "report"), "seconds": seconds,
            "batches": batches, "result": os.path.join(folder, "result.json")}
    with open(os.path.join(folder, "case.json"), "w") as f:
        json.dump(case, f)
    log_path = os.path.join(folder, "log.txt")
    started = time.monotonic()
    timed_out = False
    with GpuSampler(gpu if gpu is not None else 0) as sampler, open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--case", os.path.join(folder, "case.json")],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGTERM)  # topo's teardown on SIGTERM
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: only what it started
                proc.wait()
    result: dict[str, Any] = {}
    if os.path.exists(case["result"]):
        with open(case["result"]) as f:
            result = json.load(f)
    result.setdefault("ok", False)
    result["exit_code"], result["wall_s"] = proc.returncode, round(time.monotonic() - started, 1)
    result["spec"], result["load_average_1m"] = case["spec"], round(os.getloadavg()[0], 2)
    if timed_out:
        result.update(ok=False, error=f"timed out after {timeout:.0f} s" + (f"; {result['error']}" if "error" in result
                                                                            else ""))
    if proc.returncode != 0:
        result["ok"] = False
    procs = (result.get("report") or {}).get("processes") or {}
    roles = {procs.get("trainer_pid"): "trainer", procs.get("server_pid"): "inference server",
             **{p: "subcollector" for p in procs.get("subcollector_pids") or []},
             **{p: "env worker" for p in procs.get("worker_pids") or []}}
    result["gpu"] = sampler.result({p: r for p, r in roles.items() if p})
    if not result["ok"]:
        with open(log_path, errors="replace") as f:
            result["log_tail"] = f.read()[-3000:]
    return result


def ready_s(result: dict) -> float | None:
    return ((result.get("report") or {}).get("timings_s") or {}).get("all_ready")


# -- the steps ---------------------------------------------------------------------------------------------------------

class Check:
    def __init__(self, args, found: dict, work: str, started: float):
        self.args, self.found, self.work = args, found, work
        self.dry = args.cpu_dry
        self.gpu = None if self.dry else 0
        self.cuda = bool(found["torch"].get("cuda_devices"))
        self.device = "cuda" if self.cuda and not self.dry else "cpu"  # the policy's
        self.camera = args.camera or (64 if self.dry or args.quick else 256)
        self.deadline = started + args.budget
        self.env = child_env(found.get("egl", {}).get("vendor_file"))
        self.steps: dict[str, dict] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self, wanted: float, least: float) -> float | None:
        """``wanted`` seconds or what is left of the budget, None when less than ``least`` is left."""
        left = self.left() - KILL_GRACE_S - 10  # a step past its timeout gets KILL_GRACE_S to tear down
        return None if left < least else min(wanted, left)

    def step(self, name: str, fn) -> None:
        started = time.monotonic()
        print(f"gpu-check: {name} ...", flush=True)
        try:
            out = fn()
        except Exception as e:
            out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        out["seconds"] = round(time.monotonic() - started, 1)
        self.steps[name] = out
        print(f"gpu-check: {name}: {'ok' if out.get('ok') else 'FAILED: ' + str(out.get('error') or out.get('problems'))}"
              f" ({out['seconds']} s)", flush=True)

    def skipped(self, what: str) -> dict:
        return {"ok": False, "skipped": True, "error": f"out of time: {self.left():.0f} s of the budget left for {what}"}

    # 1
    def render(self) -> dict:
        w = 2 if self.dry or self.args.quick else 4
        timeout = self.timeout(240, 60)
        if timeout is None:
            return self.skipped("the render step")
        spec = spec_of(f"gpu-check-render-1x{w}", 1, w, camera=self.camera, render_gpu=self.gpu, policy_device=None)
        got = run_case("render", spec, self.work, seconds=0, batches=3, timeout=timeout, gpu=self.gpu, env=self.env)
        check = render_check((got.get("report") or {}).get("render_devices"), w, self.gpu)
        gpu = got.get("gpu") or {}
        per = gpu.get("peak_over_baseline_mb")
        out = {"ok": bool(got.get("ok")) and check["ok"], "shape": f"1x{w}", "camera_px": self.camera,
               "render_check": check, "on_gpu_by_role": (got.get("gpu") or {}).get("on_gpu_by_role"),
               "ready_s": ready_s(got), "gpu_mb_per_worker": round(per / w, 1) if per else None,
               "worker_peak_rss_mb": ((got.get("report") or {}).get("memory") or {}).get("peak_rss_mb"), "run": got}
        if not got.get("ok"):
            out["error"] = got.get("error") or "the run failed"
        elif not check["ok"]:
            out["error"] = "; ".join(check["problems"])
        if not out["ok"] and self.left() > 200:  # why: topo doctor on the same spec (GL, render devices, imports)
            out["doctor"] = doctor(got["spec"], self.env)
        return out

    # 2
    def policy_modes(self) -> dict:
        s, w = (1, 2) if self.dry else (1, 4) if self.args.quick else (2, 4)
        if not self.dry and not self.cuda:
            torch = self.found["torch"]
            return {"ok": False, "error": f"torch {torch.get('version', '?')} sees no CUDA device "
                    f"({torch.get('error') or 'a CPU build?'}): TinyVLA cannot run on CUDA; install a CUDA build of torch"}
        runs, errors = {}, []
        for mode in ("async", "sync"):
            timeout = self.timeout(240, 90)
            if timeout is None:
                runs[mode] = self.skipped(f"{mode} mode")
                errors.append(f"{mode}: skipped")
                continue
            spec = spec_of(f"gpu-check-{mode}-{s}x{w}", s, w, camera=self.camera, render_gpu=self.gpu,
                           policy_device=self.device, mode="async" if mode == "async" else "multi")
            got = run_case(mode, spec, self.work, seconds=self.args.seconds, timeout=timeout, gpu=self.gpu,
                           env=self.env)
            report = got.get("report") or {}
            policy = report.get("policy") or {}
            got["policy_device"] = policy.get("device")
            got["policy_placement"] = policy.get("placement")
            got["ready_s"] = ready_s(got)
            got["render_check"] = render_check(report.get("render_devices"), s * w, self.gpu)
            got["breakdown"] = (report.get("time_breakdown") or {}).get("line")
            if got.get("ok") and (policy.get("device") or "cpu").split(":")[0] != self.device:
                got["ok"], got["error"] = False, f"the policy ran on {policy.get('device')!r}, not {self.device}"
            if got.get("ok") and not got["render_check"]["ok"]:
                got["ok"], got["error"] = False, "; ".join(got["render_check"]["problems"])
            if got.get("ok") and not got.get("frames_per_s"):
                got["ok"], got["error"] = False, "no frames counted after the warm-up batches"
            if not got.get("ok"):
                errors.append(f"{mode}: {got.get('error') or 'the run failed'}")
            runs[mode] = got
        fps = {m: runs[m].get("frames_per_s") for m in runs}
        out = {"ok": not errors, "shape": f"{s}x{w}", "camera_px": self.camera, "policy_device": self.device,
               "seconds_measured": self.args.seconds, "runs": runs,
               "async_over_sync": round(fps["async"] / fps["sync"], 3) if fps.get("async") and fps.get("sync") else None}
        if errors:
            out["error"] = "; ".join(errors)
        return out

    # 3
    def largest(self) -> dict:
        timeout = self.timeout(330, 150)
        if timeout is None:
            return self.skipped("the largest topology")
        render = self.steps.get("render") or {}
        peak = render.get("worker_peak_rss_mb") or {}
        worker_gb = (peak.get("max") or DECLARED_WORKER_GB * 1024) / 1024
        gpu_free = gpu_worker = None
        gpu_process = GPU_PROCESS_GB
        if self.gpu is not None:
            smi = self.found["nvidia_smi"]["gpus"]
            total_used = [(g["memory_total_mb"], g["memory_used_mb"]) for g in smi if g["index"] == self.gpu]
            if total_used and None not in total_used[0]:
                gpu_free = (total_used[0][0] - total_used[0][1]) / 1024
            elif self.found["torch"].get("memory"):
                gpu_free = self.found["torch"]["memory"][self.gpu][0] / 2 ** 30
            if render.get("ok") and render.get("gpu_mb_per_worker"):
                gpu_worker = render["gpu_mb_per_worker"] / 1024
            sync = ((self.steps.get("policy_modes") or {}).get("runs") or {}).get("sync") or {}
            shape = (self.steps.get("policy_modes") or {}).get("shape")
            used = (sync.get("gpu") or {}).get("peak_over_baseline_mb")
            if used and shape and gpu_worker and sync.get("ok"):
                s2, w2 = map(int, shape.split("x"))
                gpu_process = max(GPU_PROCESS_GB, (used / 1024 - s2 * w2 * gpu_worker) / s2)
        cores = os.cpu_count() or 1
        subcollectors = 1 if self.dry else 2 if self.args.quick else 4
        host = meminfo()
        choice = largest_topology(subcollectors=subcollectors, host_available_gb=host["available_gb"],
                                  worker_gb=worker_gb, gpu_free_gb=gpu_free, gpu_worker_gb=gpu_worker,
                                  gpu_process_gb=gpu_process, max_workers=max(2, min(self.args.max_workers,
                                                                         int(self.args.max_per_core * cores))))
        choice["figures"] = {"worker_gb": round(worker_gb, 3), "worker_gb_from": "the render step's peak" if peak.get("max")
                             else "declared", "gpu_free_gb": gpu_free and round(gpu_free, 2),
                             "gpu_worker_gb": gpu_worker and round(gpu_worker, 3), "gpu_process_gb": round(gpu_process, 3),
                             "host": host, "cores": cores, "max_per_core": self.args.max_per_core,
                             "max_workers": self.args.max_workers}
        out: dict[str, Any] = {"choice": choice, "policy_device": self.device}
        if self.device != ("cpu" if self.dry else "cuda"):
            out["note"] = "torch sees no CUDA device here: the policy runs on cpu"
        if choice["workers_per_subcollector"] < 1:
            return {**out, "ok": False, "error": "not one worker fits: " + choice["arithmetic"]}
        s, w = choice["subcollectors"], choice["workers_per_subcollector"]
        estimates = []
        for _ in range(2):  # the estimate's probe may say fewer fit: then once more at what it says fits
            spec = spec_of(f"gpu-check-largest-{s}x{w}", s, w, camera=self.camera, render_gpu=self.gpu,
                           policy_device=self.device)
            est = estimate(write_spec(spec, self.work), self.env, timeout=min(150.0, self.left() - 60))
            estimates.append({k: est.get(k) for k in ("exit_code", "shape", "ready", "frames_per_s", "footprint_gb",
                                                       "refusals", "warnings", "gpu", "error", "seconds")}
                             | {"fits_per_subcollector": ((est.get("nodes") or {}).get("this host") or {})
                                .get("fits_per_subcollector"), "probe": (est.get("probe") or {}).get("source")})
            fits = estimates[-1]["fits_per_subcollector"]
            if not est.get("refusals") or not fits:
                break
            if fits < 2:  # the spec's groups are pairs of workers
                return {**out, "estimates": estimates, "ok": False,
                        "error": "the estimate says fewer than 2 workers per subcollector fit: " + "; ".join(est["refusals"])}
            w = fits - fits % 2
        out["estimates"] = estimates
        est = estimates[-1]
        timeout = self.timeout(300, 100)
        if timeout is None:
            return {**out, **self.skipped("the largest topology's launch")}
        spec = spec_of(f"gpu-check-largest-{s}x{w}", s, w, camera=self.camera, render_gpu=self.gpu,
                       policy_device=self.device)
        got = run_case("largest", spec, self.work, seconds=self.args.seconds_largest, timeout=timeout, gpu=self.gpu,
                       env=self.env)
        report = got.get("report") or {}
        check = render_check(report.get("render_devices"), s * w, self.gpu)
        ready, bound = ready_s(got), (est.get("ready") or {}).get("bound_s")
        predicted = est.get("frames_per_s") or {}
        out.update(ok=bool(got.get("ok")) and check["ok"] and bound is not None, shape=f"{s}x{w}", workers=s * w,
                   camera_px=self.camera, ready_s=ready, ready_bound_s=bound,
                   ready_over_bound=round(ready / bound, 2) if ready and bound else None,
                   ready_predicted_s=(est.get("ready") or {}).get("s"), frames_per_s=got.get("frames_per_s"),
                   frames_per_s_predicted=predicted.get(predicted.get("mode")) if predicted.get("mode") else None,
                   render_check=check, run=got)
        if not got.get("ok"):
            out["error"] = got.get("error") or "the run failed"
        elif not check["ok"]:
            out["error"] = "; ".join(check["problems"])
        elif bound is None:
            out["error"] = "the estimate gave no bound: " + str(est.get("error"))
        return out


def estimate(spec_path: str, env: dict, timeout: float) -> dict[str, Any]:
    """``topo plan SPEC --estimate --format json --force``: its JSON (``exit_code``, ``seconds``; ``error``)."""
    started = time.monotonic()
    done = _run([sys.executable, "-m", "topo.cli", "plan", spec_path, "--estimate", "--format", "json", "--force"],
                timeout=max(timeout, 30), env=env)
    seconds = round(time.monotonic() - started, 1)
    if done is None:
        return {"exit_code": None, "error": f"timed out after {timeout:.0f} s", "seconds": seconds}
    start = done.stdout.find("{")
    try:
        out = json.loads(done.stdout[start:]) if start >= 0 else {}
    except json.JSONDecodeError:
        out = {}
    out.update(exit_code=done.returncode, seconds=seconds)
    if done.returncode != 0 or not out.get("ready"):
        out["error"] = done.stderr[-2000:]
    return out


def doctor(spec_path: str, env: dict) -> list[dict] | dict:
    """``topo doctor SPEC --format json``: each check's name, status and detail (or why it did not answer)."""
    done = _run([sys.executable, "-m", "topo.cli", "doctor", spec_path, "--format", "json"], timeout=180, env=env)
    if done is None:
        return {"error": "topo doctor did not answer in 180 s"}
    start = done.stdout.find("{")
    try:
        checks = json.loads(done.stdout[start:])["checks"]
    except (ValueError, KeyError):
        return {"exit_code": done.returncode, "error": (done.stderr or done.stdout)[-1500:]}
    return [{k: c.get(k) for k in ("name", "status", "detail")} for c in checks]


def git_commit() -> str | None:
    done = _run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], timeout=10)
    return done.stdout.strip() if done is not None and done.returncode == 0 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smaller topologies, shorter measures (at most 5 min)")
    parser.add_argument("--cpu-dry", action="store_true",
                        help="no GPU needed: the same steps with CPU rendering and the policy on cpu, 1 x 2")
    parser.add_argument("--out", help="the JSON [benchmarks/results/gpu_check.json; --cpu-dry: gpu_check_cpu_dry.json]")
    parser.add_argument("--work", help="where the specs, run reports and logs go [a new temporary folder]")
    parser.add_argument("--budget", type=float, help="seconds for the whole [540; --quick 300; --cpu-dry 900]")
    parser.add_argument("--seconds", type=float, help="frames/s measured over this, per mode [30; --quick 10]")
    parser.add_argument("--seconds-largest", type=float, help="the same for the largest topology [20; --quick 10]")
    parser.add_argument("--max-per-core", type=float, help="the largest topology's workers per core at most "
                        "[6; --quick 2; --cpu-dry 1]")
    parser.add_argument("--max-workers", type=int, help="and at most this many in all [128; --quick 32]")
    parser.add_argument("--camera", type=int, help="camera px [256; --quick, --cpu-dry 64]")
    parser.add_argument("--steps", default="render,policy_modes,largest", help="which steps, in order")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        case_main(args.case)
        return 0
    small = args.quick or args.cpu_dry
    args.budget = args.budget or (900 if args.cpu_dry else 300 if args.quick else 540)
    args.seconds = args.seconds or (10 if small else 30)
    args.seconds_largest = args.seconds_largest or (10 if small else 20)
    args.max_per_core = args.max_per_core or (1 if args.cpu_dry else 2 if args.quick else 6)
    args.max_workers = args.max_workers or (32 if small else 128)  # a bigger host: still within the budget
    started = time.monotonic()
    found = detect()
    reason = no_gpu_reason(found)
    if reason is not None and not args.cpu_dry:
        print(f"gpu-check: no GPU ({reason}): nothing to check (--cpu-dry runs the same steps on the CPU)")
        return 0
    found["egl"] = egl_setup(gpu=not args.cpu_dry)
    out_path = args.out or os.path.join(RESULTS, "gpu_check_cpu_dry.json" if args.cpu_dry else "gpu_check.json")
    work = args.work or tempfile.mkdtemp(prefix="topo-gpu-check-")
    os.makedirs(work, exist_ok=True)
    check = Check(args, found, work, started)
    print(f"gpu-check: {'CPU dry run' if args.cpu_dry else found['nvidia_smi']['status']}; work in {work}; "
          f"JSON to {out_path}", flush=True)
    data = {"what": " ".join(__doc__.split("\n\n")[0].split()), "mode": "cpu-dry" if args.cpu_dry else "gpu", "quick": args.quick,
            "when": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "commit": git_commit(),
            "host": os.uname().nodename, "cpus": os.cpu_count(), "memory": meminfo(), "found": found,
            "budget_s": args.budget, "camera_px": check.camera}
    fns = {"render": check.render, "policy_modes": check.policy_modes, "largest": check.largest}
    for name in args.steps.split(","):
        check.step(name, fns[name])
        failed = [n for n, s in check.steps.items() if not s.get("ok")]
        data.update(steps=check.steps, summary=summary(check.steps), ok=not failed, failed=failed,
                    seconds=round(time.monotonic() - started, 1), load_average_at_end=os.getloadavg())
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(data, f, indent=1, default=str)
    print(json.dumps(data["summary"], indent=1))
    print(f"gpu-check: {'all passed' if data['ok'] else 'FAILED: ' + ', '.join(data['failed'])}; {out_path}")
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
