"""Real LIBERO envs built the way a topo env worker builds them (slow: ~10 s and ~2 GB each)."""
import os

import numpy as np
import pytest

from topo.backends import get_backend
from topo.backends.base import Assignment

from tests.libero.libero_helpers import needs_libero, run_python

pytestmark = [pytest.mark.libero, needs_libero]
SHARED = {"task_suite": "libero_spatial", "camera_height": 64, "camera_width": 64, "max_episode_steps": 8,
          "env_kwargs": {"hard_reset": False}}


def row(task_id: int) -> dict:
    backend = get_backend("libero")
    catalog = backend.catalog(SHARED)
    a = Assignment(subcollector=0, index=1, global_index=5, task_id=task_id, instruction=catalog.language[task_id],
                   group_id_offset=5_000_000, group_repeats=2, group_id_mode="init_state", seed=5,
                   init_state_mode="cycle", init_state_id=0, render_gpu=None)
    return {"builder": backend.builder, "env": backend.env_kwargs(SHARED, a), "seed": 5, "render_gpu": None,
            "worker": {"subcollector": 0, "index": 1, "global_index": 5}}


@pytest.fixture
def gl_env():
    """The builder sets process-wide GL variables: restore them for the rest of the session."""
    keys = ("MUJOCO_GL", "PYOPENGL_PLATFORM", "MUJOCO_EGL_DEVICE_ID")
    saved = {k: os.environ.get(k) for k in keys}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_worker_builds_resets_and_steps_a_libero_env(gl_env):
    from topo.backends.libero import suites
    from topo.worker import make_env

    kwargs = row(3)
    env = make_env(**kwargs)
    try:
        td = env.reset()
        assert td["language_instruction"] == kwargs["env"]["instruction"] == (
            "pick up the black bowl on the cookie box and place it on the plate")
        assert td["observation", "image"].shape == (3, 64, 64) and td["observation", "state"].shape == (9,)
        assert td["group_id"].item() == 5_000_000  # offset + init state 0 (cycle, first episode)
        td = env.step(td.set("action", env.action_spec.rand()))
        assert td["next", "observation", "image"].shape == (3, 64, 64)
        assert td["next", "language_instruction"] == kwargs["env"]["instruction"]
        suite = suites()["libero_spatial"]
        with np.load(suite.init_states(suite.tasks[3])) as archive:
            assert np.array_equal(env.init_states, archive["states"])
        device = env.topo_render_device
        assert (device["gl"], device["numbering"], device["cuda_device"], device["egl_device"]) == \
            ("egl", None, None, None)
        assert device["renderer"]
    finally:
        env.close()


def test_build_with_an_empty_libero_config_path(tmp_path):
    """The LIBERO_CONFIG_PATH trap: torchrl alone would write a config without the assets."""
    proc = run_python(f"""
        from topo.worker import make_env
        env = make_env(**{row(0)!r})
        td = env.reset()
        assert td["observation", "image"].shape == (3, 64, 64)
        env.close()
        print("BUILT")
    """, env={"LIBERO_CONFIG_PATH": str(tmp_path)})
    assert proc.returncode == 0 and "BUILT" in proc.stdout, proc.stderr[-3000:]
    assert (tmp_path / "config.yaml").is_file()


def test_build_on_a_render_gpu_path():
    """The GPU path end to end, with this host's (Mesa) EGL device posing as CUDA device 0."""
    kwargs = {**row(1), "render_gpu": 0}
    proc = run_python(f"""
        import topo.envs.libero as L
        from topo.worker import make_env
        L.egl_devices = lambda: [0]
        env = make_env(**{kwargs!r})
        assert env.reset()["observation", "image"].shape == (3, 64, 64)
        device = env.topo_render_device
        assert (device["cuda_device"], device["egl_device"]) == (0, 0), device
        env.close()
        print("BUILT")
    """, env={"CUDA_VISIBLE_DEVICES": "3"})
    assert proc.returncode == 0 and "BUILT" in proc.stdout, proc.stderr[-3000:]


def test_build_on_egl_numbering_and_the_device_zero_fallback():
    """EGL ids as the recipe numbers them, on this host's real (Mesa) EGL device 0: as it is, then EGL id 3 through
    the device-zero fallback (one EGL device here, so 3 is beyond it)."""
    for render, want in (({"render_gpu": 0, "render_numbering": "egl"}, (0, None, None)),
                         ({"render_gpu": 3, "render_numbering": "egl", "render_fallback": True}, (0, None, "3,0"))):
        kwargs = {**row(1), **render}
        proc = run_python(f"""
            import os
            from topo.worker import make_env
            env = make_env(**{kwargs!r})
            assert env.reset()["observation", "image"].shape == (3, 64, 64)
            device = env.topo_render_device
            assert (device["egl_device"], device["cuda_device"], device["fallback"]) == {want!r}, device
            assert device["fallback"] is None or os.environ["CUDA_VISIBLE_DEVICES"] == device["fallback"]
            assert os.environ["MUJOCO_EGL_DEVICE_ID"] == "0"
            env.close()
            print("BUILT", device["renderer"])
        """)
        assert proc.returncode == 0 and "BUILT" in proc.stdout, proc.stderr[-3000:]
