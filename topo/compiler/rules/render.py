"""Rules on the render devices: render_gpus or render_devices (of training, and of the eval subcollectors)."""
from __future__ import annotations

from topo.diagnostics import Diagnostic, error, warning
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context


def render_devices(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """render_gpus or render_devices: one of them, a numbering the backend's builder resolves, and a fallback
    only where it means something."""
    return devices(spec, ctx, ("assignment",), spec.render_gpus, spec.render_numbering, spec.render_fallback)


def devices(spec: Spec, ctx: Context, section: tuple, ids, numbering: str, fallback: bool) -> list[Diagnostic]:
    """The render device checks of one section (``assignment``, ``eval``)."""
    backend = ctx.backend
    both = spec.wrote(*section, "render_devices")
    path = section + ("render_devices",) if both else section + ("render_gpus",)
    out = []
    if both and spec.wrote(*section, "render_gpus"):
        out.append(error("render-devices-twice", "render_gpus and render_devices both name the render devices", path,
                         "keep one: render_gpus: [0, 1] is render_devices: {ids: [0, 1], numbering: cuda}"))
    if ids and backend is not None and not backend.uses_gl(spec.env_kwargs):
        out.append(warning("render-gpus-unused", f"backend {spec.backend!r} does not render, {path[-1]} has no effect",
                           path, f"remove {path[-1]}"))
    elif ids and backend is not None and numbering not in backend.render_numberings:
        out.append(error("render-numbering-unsupported", f"backend {spec.backend!r} resolves render devices from "
                         f"{' or '.join(backend.render_numberings)} indices, not {numbering}",
                         path + ("numbering",), "use numbering: cuda (CUDA indices, as torch and nvidia-smi count)"))
    if fallback and numbering != "egl":
        out.append(error("render-fallback-needs-egl", "device_zero_fallback applies to EGL ids (vla_grpo's "
                         "render_gpu_device_zero_fallback); CUDA ids are mapped to the EGL device showing them",
                         path + ("device_zero_fallback",), "set numbering: egl, or remove device_zero_fallback"))
    return out
