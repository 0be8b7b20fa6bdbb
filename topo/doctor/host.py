"""``topo doctor SPEC``: can this host launch that topology? One line per check: ok / warn / FAIL.

Checks: the backend's runtime imports, a GL context (when the env renders), the render GPUs the spec
names (in its numbering, CUDA or EGL) and whether this host's EGL and CUDA number its GPUs alike, the
backend's own checks (:meth:`topo.backends.Backend.host_checks`: LIBERO's task files, init states,
assets and path config), and memory. Anything that may hang or crash (imports, GL, EGL) runs in a
subprocess with a timeout. Exit 1 when a check fails. Importing this module imports neither torch nor a
simulator. A plan with ``placement.engine: ray`` is checked on every node of its cluster instead
(:mod:`topo.doctor.cluster`).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any, Iterable


from topo.runtime import child
from topo.backends import Backend, available, get_backend
from topo.checks import FAIL, OK, WARN, Check
from topo.estimate.host import available_gb
from topo.estimate.model import PROCESS_GB, Memory, declared

PROBE_MARK = "TOPO-PROBE "
IMPORT_TIMEOUT = 180.0
GL_TIMEOUT = 60.0


def run_checks(plan: dict) -> list[Check]:
    """Every check for ``plan`` on this host, memory for the whole launch included."""
    return [*host_checks(plan), check_memory(plan, available_gb(), _backend(plan))]


def host_checks(plan: dict, subcollectors: Iterable[int] | None = None) -> list[Check]:
    """The checks of this host for ``plan`` but memory, render devices for the workers of ``subcollectors``
    (None: all); the subprocess probes run concurrently."""
    backend = _backend(plan)
    subs = plan["subcollectors"] if subcollectors is None else [plan["subcollectors"][i] for i in subcollectors]
    gpus = sorted({w["render_gpu"] for sub in subs for w in sub["workers"]} - {None})
    probes = {"imports": _start("imports", [plan["env"]["backend"], plan["env"]["builder"], *_factory_modules(plan)]),
              "torchrl": _start("torchrl", list(_features(plan)))}
    if backend is not None and backend.uses_gl(plan["env"]["kwargs"]):
        probes["gl"] = _start("gl")
    if gpus:
        probes["egl"] = _start("egl")
    results = {name: _finish(proc, IMPORT_TIMEOUT if name == "imports" else GL_TIMEOUT) for name, proc in probes.items()}
    checks = [check_backend(plan["env"]["backend"], backend), check_imports(plan, results["imports"], backend),
              check_torchrl(results["torchrl"], _features(plan))]
    if "gl" in results:
        checks.append(check_gl(results["gl"]))
    render = plan.get("render") or {}  # plans written before render numbering: CUDA indices
    numbering, fallback = render.get("numbering") or "cuda", bool(render.get("device_zero_fallback"))
    nvidia = _nvidia_gpus() if gpus or "gl" in results else None
    if gpus or "gl" in results:
        gl = _gl_per_gpu(gpus, results.get("egl"), numbering, fallback)
        checks.append(check_devices(gpus, results.get("egl"), nvidia, gl, numbering, fallback))
    if gpus:
        cuda = _visible_count(len(nvidia)) if nvidia else 0
        checks.append(check_numbering((results.get("egl") or {}).get("devices"), cuda, numbering, gpus))
    if backend is not None:
        checks.extend(backend.host_checks(plan, results["imports"].get("facts") or {}))
    return checks


def _gl_per_gpu(gpus: list[int], egl: dict | None, numbering: str = "cuda", fallback: bool = False) -> dict[int, dict]:
    """A GL context on the EGL device of each render GPU, as its workers will create it."""
    resolved = _resolve_all(gpus, (egl or {}).get("devices") or [], numbering, fallback)
    procs = {}
    for g, r in resolved.items():
        if isinstance(r, dict):
            env = {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "MUJOCO_EGL_DEVICE_ID": str(r["egl_device"])}
            if r["fallback"] is not None:
                env["CUDA_VISIBLE_DEVICES"] = r["fallback"]
            procs[g] = _start("gl", env=env)
    return {g: _finish(proc, GL_TIMEOUT) for g, proc in procs.items()}


def _resolve_all(gpus: list[int], devices: list[int | None], numbering: str, fallback: bool) -> dict[int, dict | str]:
    """Each render id's device as its worker will resolve it (:func:`topo.runtime.gl.resolve_device`), or why not."""
    from topo.runtime.gl import resolve_device

    out: dict[int, dict | str] = {}
    for g in gpus:
        try:
            out[g] = resolve_device(g, numbering, fallback, devices)
        except RuntimeError as exc:
            out[g] = str(exc)
    return out


# -- checks (pure: they take what the probes found) --------------------------------------------------

def check_backend(name: str, backend: Backend | None) -> Check:
    """Where the plan's backend comes from here (built in, a plug-in's distribution, a user factory)."""
    found = available()
    if backend is None:
        return Check("backend", FAIL, f"no backend {name!r} here (found: {', '.join(sorted(found))})",
                     f"install the package that registers {name!r} under the topo.backends entry points")
    return Check("backend", OK, f"{name}: {found.get(name, 'a user factory')}")


def check_imports(plan: dict, probe: dict, backend: Backend | None) -> Check:
    builder = plan["env"]["builder"]
    if probe.get("error"):
        hint = backend.install_hint if backend is not None else \
            f"install the package that provides backend {plan['env']['backend']!r} (a topo.backends entry point)"
        return Check("imports", FAIL, f"{builder} does not import: {probe['error']}", hint)
    versions = ", ".join(f"{k} {v}" for k, v in probe.get("versions", {}).items())
    return Check("imports", OK, f"{builder} imports ({versions}) in {probe.get('seconds', 0):.1f} s")


def check_torchrl(probe: dict, features: tuple[str, ...]) -> Check:
    """The installed torchrl against what topo needs of it for this plan (:mod:`topo.launch.boundary`)."""
    from topo.launch.boundary import Support

    if "error" in probe and "version" not in probe:
        return Check("torchrl", FAIL, f"torchrl could not be checked: {probe['error']}", "pip install 'topo[launch]'")
    support = Support(probe["version"], probe["tested"], probe["missing"], probe["error"])
    refused = support.refusal(features)
    if refused:
        return Check("torchrl", FAIL, refused, "pip install 'torchrl==0.14.1'")
    warnings = support.warnings(features)
    if warnings:
        return Check("torchrl", WARN, "; ".join(warnings), "topo is tested with torchrl==0.14.1")
    return Check("torchrl", OK, f"torchrl {support.version} (tested: {support.tested}): every name topo uses for "
                 f"{', '.join(features)} is present")


def check_gl(probe: dict) -> Check:
    gl = probe.get("gl") or os.environ.get("MUJOCO_GL", "egl")
    if probe.get("error"):
        hint = ("install libosmesa6 (Debian/Ubuntu), or use MUJOCO_GL=egl" if gl == "osmesa" else
                "install an EGL driver: NVIDIA's (libEGL_nvidia) or Mesa's (libegl1 libegl-mesa0 libgl1-mesa-dri libgbm1)")
        return Check("gl", FAIL, f"MUJOCO_GL={gl}: no GL context: {probe['error']}", hint)
    renderer = probe.get("renderer")
    return Check("gl", OK, f"MUJOCO_GL={gl}: context created, renderer {renderer or 'unknown'!r}"
                 + (" (software rendering on the CPU)" if _software(renderer) else ""))


def check_devices(gpus: list[int], egl: dict | None, nvidia: list[str] | None,
                  gl: dict[int, dict] | None = None, numbering: str = "cuda", fallback: bool = False) -> Check:
    """The render devices named in the plan, resolved as the workers will (CUDA ids: visible to CUDA and shown
    by one EGL device each; EGL ids: within this host's EGL devices, or the device-zero fallback), and rendering."""
    if not gpus:
        return Check("render-gpus", OK, "the spec names no render GPU: workers render on the CPU (EGL on Mesa, or OSMesa)")
    devices = (egl or {}).get("devices")
    seen = _describe_egl(devices or [])
    egl_hint = "install NVIDIA's EGL driver (libEGL_nvidia.so, /usr/share/glvnd/egl_vendor.d/10_nvidia.json)"
    if numbering == "cuda":
        if nvidia is None:
            return Check("render-gpus", FAIL, f"the spec renders on GPU(s) {gpus} but this host has no NVIDIA GPU "
                         f"(nvidia-smi not found or failing; {seen})", "drop assignment.render_gpus to render on the "
                         "CPU, or run `topo doctor` on the launch host")
        visible = _visible_count(len(nvidia))
        missing = [g for g in gpus if g >= visible]
        if missing:
            return Check("render-gpus", FAIL, f"render GPU(s) {missing} do not exist: {visible} CUDA device(s) visible "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})",
                         f"use CUDA indices 0-{visible - 1} in assignment.render_gpus" if visible else None)
    if egl is None or egl.get("error"):
        return Check("render-gpus", FAIL, f"cannot list EGL devices: {(egl or {}).get('error')}", egl_hint)
    resolved = _resolve_all(gpus, devices or [], numbering, fallback)
    unresolved = [g for g, r in resolved.items() if isinstance(r, str)]
    if unresolved and numbering == "cuda":
        return Check("render-gpus", FAIL, f"no single EGL device shows CUDA device(s) {unresolved} ({seen})", egl_hint)
    if unresolved:
        return Check("render-gpus", FAIL, f"EGL device(s) {unresolved} do not exist: {seen}",
                     f"use EGL ids below {len(devices)}, or device_zero_fallback: true where EGL lists only the "
                     "GPUs in CUDA_VISIBLE_DEVICES" if devices else egl_hint)
    gl = gl or {}
    broken = {g: r["error"] for g, r in gl.items() if r.get("error")}
    if broken:
        return Check("render-gpus", FAIL, "no GL context on " + "; ".join(
            f"{_device_name(g, resolved[g])}: {e}" for g, e in broken.items()), egl_hint)
    parts = [f"{_device_name(g, resolved[g])} ({gl.get(g, {}).get('renderer') or 'not probed'})" for g in gpus]
    software = [g for g in gpus if _software(gl.get(g, {}).get("renderer"))]
    if software:
        return Check("render-gpus", WARN, ", ".join(parts) + f": GPU(s) {software} render in software", egl_hint)
    nvidia_count = f"{len(nvidia)} NVIDIA GPU(s)" if nvidia else "no NVIDIA GPU"
    return Check("render-gpus", OK, ", ".join(parts) + f"; {nvidia_count}, {len(devices)} EGL device(s)")


def check_numbering(devices: list[int | None] | None, cuda_count: int, numbering: str, ids: list[int]) -> Check:
    """Whether EGL lists this host's GPUs in CUDA's order: where it does not, one id names two different GPUs
    (an EGL id copied into a CUDA-numbered spec, or the reverse, renders elsewhere)."""
    if not devices:
        return Check("render-numbering", WARN, "no EGL device listed: cannot compare EGL and CUDA numbering",
                     "see the render-gpus check")
    shown = [(e, c) for e, c in enumerate(devices) if c is not None]
    if not shown:
        return Check("render-numbering", OK, f"none of the {len(devices)} EGL device(s) is a CUDA GPU "
                     f"({cuda_count} CUDA device(s) visible): EGL and CUDA numbering name no common device here")
    order = ", ".join(f"EGL {e} = CUDA {c}" for e, c in shown)
    differ = [e for e, c in shown if e != c]
    unseen = cuda_count - len(shown)
    if not differ and unseen <= 0:
        return Check("render-numbering", OK, f"EGL and CUDA number the {len(shown)} GPU(s) alike ({order}): "
                     "an id names the same GPU in either numbering")
    detail = f"EGL and CUDA number the GPUs differently here: {order}" if differ else f"EGL lists {order}"
    if unseen > 0:
        detail += f"; EGL shows {len(shown)} of the {cuda_count} CUDA device(s)"
    if numbering == "cuda":
        return Check("render-numbering", OK, detail + "; the spec's ids are CUDA indices, mapped to their EGL devices")
    named = ", ".join(f"EGL {g} = CUDA {devices[g]}" if g < len(devices) and devices[g] is not None else
                      f"EGL {g} = no CUDA device" if g < len(devices) else f"EGL {g} not listed" for g in ids)
    hint = "ids taken from nvidia-smi, torch or CUDA_VISIBLE_DEVICES are CUDA indices: write those with " \
           "render_devices.numbering: cuda (or render_gpus)"
    if unseen > 0:
        hint += "; where EGL only lists the GPUs in CUDA_VISIBLE_DEVICES, device_zero_fallback: true renders an id " \
                "it does not list on EGL 0"
    return Check("render-numbering", WARN, detail + f"; the spec's ids are EGL indices: {named}", hint)


def _device_name(g: int, r: dict) -> str:
    """One resolved render id: 'CUDA 0 -> EGL 2', 'EGL 2 = CUDA 0', 'EGL 5 -> EGL 0 with CUDA_VISIBLE_DEVICES=5,0'."""
    if r["numbering"] == "cuda":
        return f"CUDA {g} -> EGL {r['egl_device']}"
    if r["fallback"] is not None:
        return f"EGL {g} -> EGL {r['egl_device']} with CUDA_VISIBLE_DEVICES={r['fallback']} (device-zero fallback)"
    return f"EGL {g} = " + (f"CUDA {r['cuda_device']}" if r["cuda_device"] is not None else "not a CUDA GPU")


def _describe_egl(devices: list[int | None]) -> str:
    mapped = [f"CUDA {cuda} -> EGL {i}" for i, cuda in enumerate(devices) if cuda is not None]
    return f"{len(devices)} EGL device(s), " + (", ".join(mapped) if mapped else "none of them a CUDA GPU")


def _software(renderer: str | None) -> bool:
    return renderer is not None and any(s in renderer.lower() for s in ("llvmpipe", "softpipe", "swrast"))


def check_memory(plan: dict, available_gb: float, backend: Backend | None) -> Check:
    """Estimated peak memory of the whole launch (its workers, a collector process per subcollector and the
    top one) against what this host has available now."""
    workers = sum(sub["num_workers"] for sub in plan["subcollectors"])
    return estimate_memory(workers, len(plan["subcollectors"]) + 1, worker_gb(backend), available_gb)


def worker_gb(backend: Backend | None) -> float:
    """One env worker's estimated memory: the backend's, else a torch + torchrl process's."""
    return declared(backend.memory_per_worker_gb if backend else None).worker_gb


def estimate_memory(workers: int, processes: int, per_worker: float, available_gb: float, note: str = "") -> Check:
    """``workers`` env workers and ``processes`` collector processes against ``available_gb``; ``note`` ends the detail."""
    need = Memory(workers, per_worker, processes, PROCESS_GB)
    detail = (f"~{need.gb:.1f} GB needed ({workers} workers x {per_worker:.1f} GB + {processes} collector processes "
              f"x {PROCESS_GB:.1f} GB), {available_gb:.1f} GB available{note}")
    fits = need.workers_fitting(available_gb)
    if need.gb > available_gb:
        return Check("memory", FAIL, detail, f"this host fits about {fits} workers: fewer workers, or a "
                     "bigger host (the launch would swap or be OOM-killed)")
    if need.gb > 0.8 * available_gb:
        return Check("memory", WARN, detail + " (over 80 %)", f"leaves little headroom; this host fits about {fits} workers")
    return Check("memory", OK, detail)


# -- probes (each runs in a child process; prints one JSON line) -------------------------------------

def _start(kind: str, args: list[str] = (), env: dict[str, str] | None = None) -> subprocess.Popen:
    code = f"import topo.doctor.host as d; d._probe({kind!r}, {list(args)!r})"
    return subprocess.Popen(child.command(code), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def _finish(proc: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return {"error": f"timed out after {timeout:.0f} s (hung)"}
    for line in reversed(out.splitlines()):
        if line.startswith(PROBE_MARK):
            return json.loads(line[len(PROBE_MARK):])
    last = (err.strip().splitlines() or ["no output"])[-1]
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit {proc.returncode}"
    return {"error": f"probe crashed ({how}): {last}"}


def _probe(kind: str, args: list[str]) -> None:
    """Child side: run one probe, print its result after PROBE_MARK."""
    import time

    started = time.monotonic()
    try:
        result = {"imports": _probe_imports, "gl": _probe_gl, "egl": _probe_egl, "torchrl": _probe_torchrl}[kind](*args)
    except BaseException as exc:  # report anything, SystemExit and EOFError (a stdin prompt) included
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = time.monotonic() - started
    print(PROBE_MARK + json.dumps(result), flush=True)


def _probe_imports(name: str, builder: str, *modules: str) -> dict:
    import importlib
    import importlib.metadata

    backend = get_backend(name)
    for module in ("torchrl.envs", builder.partition(":")[0], *backend.imports, *modules):
        importlib.import_module(module)
    result: dict[str, Any] = {"versions": {}}
    for dist in ("torch", "torchrl", *backend.distributions):
        try:
            result["versions"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    result["facts"] = backend.host_facts()
    return result


def _probe_torchrl(*features: str) -> dict:
    from topo.launch.boundary import check

    return check(tuple(features)).to_dict(tuple(features))


def _features(plan: dict) -> tuple[str, ...]:
    from topo.launch.boundary import features_of

    return features_of(plan, (plan.get("policy") or {}).get("placement") if (plan.get("policy") or {}).get("factory")
                       else None)


def _probe_gl() -> dict:
    from topo.runtime.gl import gl_renderer, select

    gl = select()
    import mujoco

    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='.1'/></worldbody></mujoco>")
    renderer = mujoco.Renderer(model, 32, 32)
    renderer.update_scene(mujoco.MjData(model))
    if renderer.render().shape != (32, 32, 3):
        raise RuntimeError("rendered frame has the wrong shape")
    return {"gl": gl, "renderer": gl_renderer()}


def _probe_egl() -> dict:
    from topo.runtime.gl import egl_devices

    return {"devices": egl_devices()}


# -- host facts ----------------------------------------------------------------------------------------

def _nvidia_gpus() -> list[str] | None:
    """``nvidia-smi -L`` lines, or None when there is no working NVIDIA driver."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return lines if out.returncode == 0 and lines else None


def _visible_count(physical: int) -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return physical
    return len([d for d in visible.split(",") if d.strip()])


def _backend(plan: dict) -> Backend | None:
    try:
        return get_backend(plan["env"]["backend"])
    except LookupError:
        return None


def _factory_modules(plan: dict) -> Iterable[str]:
    """A user factory's module (its row kwargs name it), to import beside the builder."""
    first = next((w["kwargs"]["env"] for sub in plan["subcollectors"] for w in sub["workers"]), {})
    factory = first.get("factory") if isinstance(first, dict) else None
    return [factory.partition(":")[0]] if isinstance(factory, str) else []


def render_text(spec: str, plan: dict, checks: list[Check]) -> str:
    workers = "+".join(str(sub["num_workers"]) for sub in plan["subcollectors"])
    lines = [f"topo doctor {spec}: backend {plan['env']['backend']}, workers {workers}",
             *check_lines(checks, max(len(c.name) for c in checks)),
             summary(checks, "ready to launch", "cannot launch here")]
    return "\n".join(lines) + "\n"


def check_lines(checks: list[Check], width: int) -> list[str]:
    """One line per check (status, name padded to ``width``, detail), and its hint unless it passed."""
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.hint and c.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  hint: {c.hint}")
    return lines


def summary(checks: list[Check], ready: str, blocked: str) -> str:
    """``blocked`` when a check failed, else ``ready``, then the count of each status."""
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    verdict = blocked if counts[FAIL] else ready
    return f"{verdict}: {counts[OK]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failure(s)"
