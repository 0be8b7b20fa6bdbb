"""GL on this host: which devices render, and GL kept in the env workers.

:func:`select`, :func:`egl_devices`, :func:`resolve_device` and :func:`gl_renderer` say what a process
renders with and where (builders and ``topo doctor`` use them). The rest keeps GL in the env workers:
no process that builds no env opens a display.

``import mujoco`` opens an EGL display when ``MUJOCO_GL=egl`` (``mujoco.egl`` does it on import), and
``import torchrl.envs`` imports mujoco. Left alone, the collector process, every subcollector and every
forkserver would hold an EGL display (on a GPU host, on the first GPU), and forked env workers would
inherit it. So topo's collector process calls :func:`hold` before it imports torch: ``MUJOCO_GL=disable``,
the user's value kept in ``TOPO_MUJOCO_GL`` for its children. Each env worker calls :func:`release`
before its builder runs. Imports neither torch nor mujoco.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import re
import sys
from typing import Any

HELD_VAR = "TOPO_MUJOCO_GL"
UNSET = "<unset>"
EGL_CUDA_DEVICE_NV = 0x323A
_GL_LIBRARY = re.compile(r"/lib(EGL|GLX|GL|OpenGL|OSMesa|glfw|cuda|nvidia-egl|nvidia-glcore)[^/]*\.so[^/]*$")


def hold() -> None:
    """In a process that builds no env (and its future children): GL off, the user's ``MUJOCO_GL`` kept."""
    if HELD_VAR not in os.environ:
        os.environ.update(held_env(os.environ.get("MUJOCO_GL")))


def held_env(mujoco_gl: str | None) -> dict[str, str]:
    """The environment variables that hold GL off in a process started elsewhere (a Ray actor)."""
    return {"MUJOCO_GL": "disable", HELD_VAR: UNSET if mujoco_gl is None else mujoco_gl}


def users_setting() -> str | None:
    """This process's ``MUJOCO_GL`` as the user set it, held or not (None: unset)."""
    held = os.environ.get(HELD_VAR)
    if held is None:
        return os.environ.get("MUJOCO_GL")
    return None if held == UNSET else held


def release() -> None:
    """In an env worker: the user's ``MUJOCO_GL`` back.

    If mujoco was imported held, ``mujoco.GLContext`` is read again from it when first asked for, not
    now: opening mujoco's own display is left to code that uses it (robosuite makes its own, on the
    render device the builder picks).
    """
    held = os.environ.pop(HELD_VAR, None)
    if held is None:
        return
    if held == UNSET:
        os.environ.pop("MUJOCO_GL", None)
    else:
        os.environ["MUJOCO_GL"] = held
    module = sys.modules.get("mujoco.gl_context")
    if module is not None and "GLContext" not in vars(module):
        module.__getattr__ = sys.modules["mujoco"].__getattr__ = _gl_context_on_demand


def _gl_context_on_demand(name: str):
    """Module ``__getattr__`` of mujoco and mujoco.gl_context while ``GLContext`` is unread."""
    if name != "GLContext":
        raise AttributeError(name)
    module, package = sys.modules["mujoco.gl_context"], sys.modules["mujoco"]
    del module.__getattr__, package.__getattr__
    importlib.reload(module)  # reads MUJOCO_GL as it is now
    if "GLContext" not in vars(module):
        raise AttributeError(f"mujoco has no GL context with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}")
    package.GLContext = module.GLContext
    return module.GLContext


def loaded_libraries() -> list[str]:
    """GL, EGL, OSMesa, GLFW and CUDA driver libraries mapped into this process (Linux; [] elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(maxsplit=5)[-1].strip() for line in f if ".so" in line}
    except OSError:
        return []
    return sorted({os.path.basename(p) for p in paths if _GL_LIBRARY.search(p)})


def select() -> str:
    """This process's GL backend: ``MUJOCO_GL`` (``egl`` unless set), with ``PYOPENGL_PLATFORM`` to match."""
    gl = os.environ.setdefault("MUJOCO_GL", "egl").lower()
    if gl in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", gl)
    return gl


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


def gl_renderer() -> str | None:
    """The GL renderer of the current context (e.g. ``llvmpipe`` = software), if one is current."""
    try:
        from OpenGL import GL

        name = GL.glGetString(GL.GL_RENDERER)
    except Exception:  # no current context, or PyOpenGL missing: nothing to report
        return None
    return name.decode() if isinstance(name, bytes) else None
