"""Render-device numbering: CUDA indices (render_gpus, the default) or EGL indices (render_devices), through
validate, plan, dry-run, the worker's resolution, doctor's checks and the launch report's line. No GPU needed:
EGL enumerations are given as data."""
from __future__ import annotations

import pytest

from tests.compiler.compiler_helpers import codes, compile_dict, libero, rows

import topo.doctor.host as doctor
from topo.doctor.host import FAIL, OK, WARN, check_devices, check_numbering
from topo.runtime.gl import resolve_device
from topo.launch.report import human
from topo.compiler.render import plan_text

EGL_RECIPE = {"ids": [2, 3, 4, 5], "numbering": "egl", "device_zero_fallback": True}


def recipe_like(render: dict, subs: int = 4) -> dict:
    return libero(subs, 8, tasks=list(range(subs)), groups={"size": 8, "parallel_repeats": True},
                  init_states={"mode": "cycle"}, **render)


# --- the plan ----------------------------------------------------------------------------------------

def test_egl_ids_reach_rows_kwargs_and_subcollectors():
    plan = compile_dict(recipe_like({"render_devices": EGL_RECIPE}, subs=5))
    assert plan["render"] == {"numbering": "egl", "device_zero_fallback": True}
    assert [s["render_gpu"] for s in plan["subcollectors"]] == [2, 3, 4, 5, 2]  # ids[c % 4]
    for row in rows(plan):
        want = [2, 3, 4, 5][row["subcollector"] % 4]
        assert (row["render_gpu"], row["render_numbering"]) == (want, "egl")
        kw = row["kwargs"]
        assert (kw["render_gpu"], kw["render_numbering"], kw["render_fallback"]) == (want, "egl", True)


def test_render_gpus_are_cuda_numbered_and_equal_render_devices_cuda():
    by_gpus = compile_dict(recipe_like({"render_gpus": [1, 0]}, subs=3))
    by_devices = compile_dict(recipe_like({"render_devices": {"ids": [1, 0]}}, subs=3))
    assert by_gpus["render"] == by_devices["render"] == {"numbering": "cuda", "device_zero_fallback": False}
    assert by_gpus["subcollectors"] == by_devices["subcollectors"]
    assert [(r["render_gpu"], r["kwargs"]["render_numbering"], r["kwargs"]["render_fallback"])
            for r in rows(by_gpus)][::8] == [(1, "cuda", False), (0, "cuda", False), (1, "cuda", False)]


def test_no_render_devices_carry_no_numbering():
    plan = compile_dict(recipe_like({}, subs=1))
    assert plan["render"] is None
    assert {(r["render_gpu"], r["render_numbering"], r["kwargs"]["render_numbering"], r["kwargs"]["render_fallback"])
            for r in rows(plan)} == {(None, None, None, False)}


def test_dry_run_says_which_numbering():
    egl = plan_text(compile_dict(recipe_like({"render_devices": EGL_RECIPE})), limit=1)
    assert "subcollector 0: 8 workers, render gpu 2 (egl)" in egl
    assert "subcollector 3: 8 workers, render gpu 5 (egl)" in egl
    assert "workers per render device (egl indices, device-zero fallback): gpu 2: 8, gpu 3: 8, gpu 4: 8, gpu 5: 8" \
        in egl
    cuda = plan_text(compile_dict(recipe_like({"render_gpus": [0, 1]}, subs=2)), limit=1)
    assert "subcollector 1: 8 workers, render gpu 1 (cuda)" in cuda
    assert "workers per render device (cuda indices): gpu 0: 8, gpu 1: 8" in cuda
    cpu = plan_text(compile_dict(recipe_like({}, subs=1)), limit=1)
    assert "render gpu -\n" in cpu and "workers per render device: cpu: 8" in cpu


def test_numbering_rules():
    assert codes(recipe_like({"render_gpus": [0], "render_devices": {"ids": [0]}})) == ["render-devices-twice"]
    assert codes(recipe_like({"render_devices": {"ids": [0], "device_zero_fallback": True}})) == \
        ["render-fallback-needs-egl"]
    assert codes(recipe_like({"render_devices": {"ids": [0], "numbering": "vulkan"}})) == ["schema-enum"]
    assert codes(recipe_like({"render_devices": {"numbering": "egl"}})) == ["schema-required"]
    gym = {"version": 1, "env": {"backend": "gym", "kwargs": {"env_name": "HalfCheetah-v5", "from_pixels": True}},
           "topology": {"subcollectors": 1, "workers_per_subcollector": 1},
           "assignment": {"render_devices": {"ids": [0], "numbering": "egl"}}}
    assert codes(gym) == ["render-numbering-unsupported"]
    gym["env"]["kwargs"]["from_pixels"] = False  # renders nothing: the ids are unused, whatever their numbering
    assert codes(gym) == ["render-gpus-unused"]


def test_ray_actor_gpu_check_is_about_cuda_ids():
    """An actor sees its own GPUs as CUDA 0..n-1; EGL ids count the node's devices, so that check does not apply."""
    def spec(render):
        data = recipe_like(render, subs=2)
        data["placement"] = {"engine": "ray", "resources": {"cpus": 9, "gpus": 1}}
        return data

    assert "placement-render-gpu-not-visible" in codes(spec({"render_gpus": [2]}))
    assert "placement-render-gpu-not-visible" not in codes(spec({"render_devices": {"ids": [2], "numbering": "egl"}}))


# --- the worker's resolution (topo.runtime.gl.resolve_device) ------------------------------------------

HOST = [2, 3, 0, 1]  # EGL devices in EGL order, each as the CUDA index it shows (an order seen on real hosts)


@pytest.mark.parametrize("numbering, render_id, egl, cuda", [
    ("cuda", 0, 2, 0), ("cuda", 3, 1, 3),  # CUDA ids go to the EGL device showing them
    ("egl", 0, 0, 2), ("egl", 3, 3, 1),    # EGL ids are used as they are
])
def test_resolution_by_numbering(numbering, render_id, egl, cuda):
    assert resolve_device(render_id, numbering, False, HOST) == \
        {"numbering": numbering, "cuda_device": cuda, "egl_device": egl, "fallback": None}


def test_device_zero_fallback_is_the_recipes():
    """An EGL id the process's EGL devices do not reach: EGL 0, CUDA_VISIBLE_DEVICES '<id>,0' ('0' for id 0)."""
    one = [0]  # EGL scoped to CUDA_VISIBLE_DEVICES: one device
    assert resolve_device(5, "egl", True, one) == {"numbering": "egl", "cuda_device": None, "egl_device": 0,
                                                   "fallback": "5,0"}
    assert resolve_device(0, "egl", True, []) == {"numbering": "egl", "cuda_device": None, "egl_device": 0,
                                                  "fallback": "0"}
    # an id EGL does reach is used as it is, fallback or not (the recipe falls back only when id >= count)
    assert resolve_device(0, "egl", True, one)["fallback"] is None
    assert resolve_device(3, "egl", True, HOST) == {"numbering": "egl", "cuda_device": 1, "egl_device": 3,
                                                    "fallback": None}


def test_resolution_failures_name_the_devices():
    with pytest.raises(RuntimeError, match=r"EGL device 5 does not exist: this process sees 1 EGL device\(s\).*"
                                           r"device_zero_fallback"):
        resolve_device(5, "egl", False, [0])
    with pytest.raises(RuntimeError, match="no EGL device shows CUDA device 4"):
        resolve_device(4, "cuda", False, HOST)
    with pytest.raises(RuntimeError, match="no EGL device shows CUDA device 0"):
        resolve_device(0, "cuda", False, [None])  # Mesa: no CUDA device to map to


# --- doctor ------------------------------------------------------------------------------------------

FOUR = [f"GPU {i}: NVIDIA H200" for i in range(4)]
NVIDIA_GL = {"renderer": "NVIDIA H200/PCIe/SSE2"}


def test_numbering_check_on_hosts_that_agree_and_disagree():
    same = check_numbering([0, 1, 2, 3], 4, "egl", [2, 3])
    assert same.status == OK and "number the 4 GPU(s) alike" in same.detail
    differ = check_numbering(HOST, 4, "egl", [2, 3])
    assert differ.status == WARN
    assert "EGL 0 = CUDA 2, EGL 1 = CUDA 3, EGL 2 = CUDA 0, EGL 3 = CUDA 1" in differ.detail
    assert "the spec's ids are EGL indices: EGL 2 = CUDA 0, EGL 3 = CUDA 1" in differ.detail
    assert "numbering: cuda" in differ.hint
    mapped = check_numbering(HOST, 4, "cuda", [0])
    assert mapped.status == OK and "differently" in mapped.detail and "mapped to their EGL devices" in mapped.detail
    scoped = check_numbering([0], 8, "egl", [5])  # EGL lists only what CUDA_VISIBLE_DEVICES shows
    assert scoped.status == WARN and "EGL shows 1 of the 8 CUDA device(s)" in scoped.detail
    assert "EGL 5 not listed" in scoped.detail and "device_zero_fallback" in scoped.hint
    mesa = check_numbering([None], 0, "egl", [0])
    assert mesa.status == OK and "none of the 1 EGL device(s) is a CUDA GPU" in mesa.detail
    assert check_numbering([], 0, "cuda", [0]).status == WARN


def test_devices_check_resolves_in_the_specs_numbering():
    egl = check_devices([2, 3], {"devices": HOST}, FOUR, {2: NVIDIA_GL, 3: NVIDIA_GL}, "egl")
    assert egl.status == OK and "EGL 2 = CUDA 0 (NVIDIA H200/PCIe/SSE2), EGL 3 = CUDA 1" in egl.detail
    cuda = check_devices([2, 3], {"devices": HOST}, FOUR, {2: NVIDIA_GL, 3: NVIDIA_GL})
    assert cuda.status == OK and "CUDA 2 -> EGL 0" in cuda.detail and "CUDA 3 -> EGL 1" in cuda.detail
    fallback = check_devices([5], {"devices": [0]}, FOUR, {5: NVIDIA_GL}, "egl", True)
    assert fallback.status == OK and "EGL 5 -> EGL 0 with CUDA_VISIBLE_DEVICES=5,0" in fallback.detail
    missing = check_devices([5], {"devices": [0]}, FOUR, {}, "egl", False)
    assert missing.status == FAIL and "EGL device(s) [5] do not exist" in missing.detail
    assert "device_zero_fallback" in missing.hint
    mesa = check_devices([0], {"devices": [None]}, None, {0: {"renderer": "llvmpipe (LLVM 15.0.6, 256 bits)"}}, "egl")
    assert mesa.status == WARN and "EGL 0 = not a CUDA GPU" in mesa.detail  # renders, in software
    assert check_devices([0], {"devices": [None]}, None, {}, "cuda").status == FAIL  # CUDA 0 on a host without one


def test_run_checks_on_a_host_whose_orders_differ(monkeypatch):
    """run_checks with the probes and the host stubbed: the numbering check, and each GL probe's env."""
    started = []

    def start(kind, args=(), env=None):
        started.append((kind, env))
        return kind

    results = {"imports": {"versions": {}, "facts": {"paths": {}}}, "gl": {"gl": "egl", "renderer": "NVIDIA H200"},
               "egl": {"devices": [0]}, "torchrl": {"version": "0.14.1", "tested": "the full suite", "error": None,
                                                    "missing": {}}}
    monkeypatch.setattr(doctor, "_start", start)
    monkeypatch.setattr(doctor, "_finish", lambda kind, timeout: results[kind])
    monkeypatch.setattr(doctor, "_nvidia_gpus", lambda: FOUR)
    monkeypatch.setattr(doctor, "available_gb", lambda: 4096.0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = compile_dict(recipe_like({"render_devices": {"ids": [0, 5], "numbering": "egl",
                                                        "device_zero_fallback": True}}, subs=2))
    checks = {c.name: c for c in doctor.run_checks(plan)}
    gl_envs = [env for kind, env in started if kind == "gl" and env]
    assert {e["MUJOCO_EGL_DEVICE_ID"] for e in gl_envs} == {"0"}
    assert sorted(e.get("CUDA_VISIBLE_DEVICES", "-") for e in gl_envs) == ["-", "5,0"]
    assert checks["render-gpus"].status == OK
    assert "EGL 5 -> EGL 0 with CUDA_VISIBLE_DEVICES=5,0" in checks["render-gpus"].detail
    numbering = checks["render-numbering"]
    assert numbering.status == WARN and "EGL shows 1 of the 4 CUDA device(s)" in numbering.detail


def test_host_checks_on_a_node_check_the_render_gpus_of_its_subcollectors_only(monkeypatch):
    """``topo doctor`` on a Ray node: the render GPUs of the subcollectors the plan puts there, no memory check."""
    results = {"imports": {"versions": {}, "facts": {"paths": {}}}, "gl": {"gl": "egl", "renderer": "NVIDIA H200"},
               "egl": {"devices": [0, 1, 2, 3]}, "torchrl": {"version": "0.14.1", "tested": "the full suite",
                                                            "error": None, "missing": {}}}
    monkeypatch.setattr(doctor, "_start", lambda kind, args=(), env=None: kind)
    monkeypatch.setattr(doctor, "_finish", lambda kind, timeout: results[kind])
    monkeypatch.setattr(doctor, "_nvidia_gpus", lambda: FOUR)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = compile_dict(recipe_like({"render_gpus": [2, 3]}, subs=2))
    node = {c.name: c for c in doctor.host_checks(plan, [1])}
    assert "memory" not in node and node["render-gpus"].status == OK
    assert node["render-gpus"].detail.startswith("CUDA 3 -> EGL 3 (") and "CUDA 2" not in node["render-gpus"].detail
    assert "CUDA 2 -> EGL 2" in {c.name: c for c in doctor.host_checks(plan)}["render-gpus"].detail


# --- the launch report's render line -----------------------------------------------------------------

def report(*devices):
    return {"ok": True, "error": None, "topology": {"subcollectors": 1, "workers": 8},
            "launch": {"batches_collected": 1, "batches_requested": 1, "shutdown_budget_s": 50},
            "constructions": {"by_role": {"trainer": 0, "server": 0, "subcollector": 0, "worker": 8},
                              "expected": {"worker": 8}},
            "timings_s": {"all_ready": 1.0, "first_batch": 1.0, "shutdown": 1.0},
            "processes": {"subcollector_exit_codes": [0], "peak": 9, "left_behind": [], "alive_after": []},
            "env_closes": {"closed": 8, "constructed": 8}, "render_devices": list(devices), "inherited_gl": {},
            "first_batch": [], "seeds": {"mismatches": [], "checked": 8}}


def test_report_line_names_the_numbering():
    lines = human(report(
        {"gl": "egl", "numbering": "cuda", "cuda_device": 0, "egl_device": 2, "fallback": None, "renderer": "NV",
         "planned": 0, "workers": 2},
        {"gl": "egl", "numbering": "egl", "cuda_device": 0, "egl_device": 2, "fallback": None, "renderer": "NV",
         "planned": 2, "workers": 2},
        {"gl": "egl", "numbering": "egl", "cuda_device": None, "egl_device": 0, "fallback": "5,0", "renderer": "NV",
         "planned": 5, "workers": 2},
        {"gl": "egl", "numbering": None, "cuda_device": None, "egl_device": None, "fallback": None,
         "renderer": "llvmpipe", "planned": None, "workers": 2},
    )).splitlines()
    assert [line for line in lines if line.startswith("  render:")] == [
        "  render: egl cuda 0 -> egl 2, NV: 2 worker(s)",
        "  render: egl egl 2 (cuda 0), NV: 2 worker(s)",
        "  render: egl egl 5 -> egl 0 with CUDA_VISIBLE_DEVICES=5,0 (device-zero fallback), NV: 2 worker(s)",
        "  render: egl cpu, llvmpipe: 2 worker(s)",
    ]
    # a device recorded before numbering existed reads as CUDA
    old = human(report({"gl": "egl", "cuda_device": 1, "egl_device": 0, "renderer": "NV", "planned": 1, "workers": 8}))
    assert "  render: egl cuda 1 -> egl 0, NV: 8 worker(s)" in old
