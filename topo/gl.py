"""GL stays in the env workers: no process that builds no env opens a display.

``import mujoco`` opens an EGL display when ``MUJOCO_GL=egl`` (``mujoco.egl`` does it on import), and
``import torchrl.envs`` imports mujoco. Left alone, the collector process, every subcollector and every
forkserver would hold an EGL display (on a GPU host, on the first GPU), and forked env workers would
inherit it. So topo's collector process calls :func:`hold` before it imports torch: ``MUJOCO_GL=disable``,
the user's value kept in ``TOPO_MUJOCO_GL`` for its children. Each env worker calls :func:`release`
before its builder runs. Imports neither torch nor mujoco.
"""
from __future__ import annotations

import importlib
import os
import re
import sys

HELD_VAR = "TOPO_MUJOCO_GL"
UNSET = "<unset>"
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
