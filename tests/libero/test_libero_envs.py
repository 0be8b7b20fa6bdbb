"""The runtime builder's setup steps: GL variables, render-device resolution, LIBERO config, init states.

Each runs in a fresh interpreter: they set process-wide environment variables.
"""
import shutil

import numpy as np
import pytest

from tests.libero.libero_helpers import needs_libero, run_python

no_nvidia = pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this host has an NVIDIA GPU")


def test_cpu_rendering_sets_egl_and_no_device():
    proc = run_python("""
        import os
        from topo.envs.libero import configure_rendering
        device = configure_rendering(None)
        assert device == {"gl": "egl", "numbering": None, "cuda_device": None, "egl_device": None,
                          "fallback": None}, device
        assert (os.environ["MUJOCO_GL"], os.environ["PYOPENGL_PLATFORM"]) == ("egl", "egl")
        assert "MUJOCO_EGL_DEVICE_ID" not in os.environ
    """)
    assert proc.returncode == 0, proc.stderr


def test_render_gpu_refused_with_a_cpu_gl_backend():
    proc = run_python("""
        from topo.envs.libero import configure_rendering
        configure_rendering(0)
    """, env={"MUJOCO_GL": "osmesa"})
    assert proc.returncode != 0 and "needs MUJOCO_GL=egl" in proc.stderr


@no_nvidia
def test_render_gpu_without_a_cuda_egl_device_fails_clearly():
    proc = run_python("""
        from topo.envs.libero import configure_rendering
        from topo.runtime.gl import egl_devices
        assert all(d is None for d in egl_devices()), egl_devices()
        configure_rendering(0)
    """)
    assert proc.returncode != 0
    assert "no EGL device shows CUDA device 0" in proc.stderr and "NVIDIA EGL driver" in proc.stderr


@needs_libero
def test_render_gpu_maps_cuda_to_egl_and_passes_robosuite_import_check():
    """CUDA 0 shown by EGL device 0, CUDA_VISIBLE_DEVICES=3: robosuite 1.4 alone refuses MUJOCO_EGL_DEVICE_ID=0."""
    env = {"CUDA_VISIBLE_DEVICES": "3", "MUJOCO_GL": "egl"}
    refused = run_python("import robosuite.utils.binding_utils", env={**env, "MUJOCO_EGL_DEVICE_ID": "0"})
    assert refused.returncode != 0 and "MUJOCO_EGL_DEVICE_ID" in refused.stderr
    proc = run_python("""
        import os, sys
        import topo.envs.libero as L
        L.egl_devices = lambda: [0]  # this host's only EGL device, posing as CUDA device 0
        device = L.configure_rendering(0)
        assert device == {"gl": "egl", "numbering": "cuda", "cuda_device": 0, "egl_device": 0, "fallback": None}, device
        assert os.environ["MUJOCO_EGL_DEVICE_ID"] == "0"
        assert "robosuite.utils.binding_utils" in sys.modules
    """, env={**env, "MUJOCO_EGL_DEVICE_ID": "5"})
    assert proc.returncode == 0, proc.stderr


def test_render_gpu_picks_the_egl_device_showing_that_cuda_device():
    proc = run_python("""
        import topo.envs.libero as L
        chosen = []
        L.egl_devices = lambda: [None, 1, 0]
        L._point_robosuite_at = chosen.append
        assert L.configure_rendering(0)["egl_device"] == 2 and L.configure_rendering(1)["egl_device"] == 1
        assert chosen == [2, 1]
    """)
    assert proc.returncode == 0, proc.stderr


def test_egl_numbering_uses_the_id_as_the_egl_device():
    proc = run_python("""
        import os
        import topo.envs.libero as L
        chosen = []
        L.egl_devices = lambda: [2, 3, 0, 1]
        L._point_robosuite_at = chosen.append
        device = L.configure_rendering(2, "egl")
        assert device == {"gl": "egl", "numbering": "egl", "cuda_device": 0, "egl_device": 2, "fallback": None}, device
        assert chosen == [2] and "CUDA_VISIBLE_DEVICES" not in os.environ
    """)
    assert proc.returncode == 0, proc.stderr


def test_egl_id_beyond_the_devices_fails_without_the_fallback():
    proc = run_python("""
        import topo.envs.libero as L
        L.egl_devices = lambda: [0]
        L.configure_rendering(5, "egl")
    """)
    assert proc.returncode != 0 and "EGL device 5 does not exist" in proc.stderr


@needs_libero
def test_device_zero_fallback_sets_the_recipes_variables_and_passes_robosuite_import_check():
    """EGL scoped to CUDA_VISIBLE_DEVICES shows one device: id 5 renders on EGL 0 with CUDA_VISIBLE_DEVICES=5,0."""
    proc = run_python("""
        import os, sys
        import topo.envs.libero as L
        L.egl_devices = lambda: [0]
        device = L.configure_rendering(5, "egl", True)
        assert device == {"gl": "egl", "numbering": "egl", "cuda_device": None, "egl_device": 0,
                          "fallback": "5,0"}, device
        assert (os.environ["CUDA_VISIBLE_DEVICES"], os.environ["MUJOCO_EGL_DEVICE_ID"]) == ("5,0", "0")
        assert "robosuite.utils.binding_utils" in sys.modules
    """, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert proc.returncode == 0, proc.stderr


def test_egl_devices_lists_this_hosts_devices():
    proc = run_python("""
        from topo.runtime.gl import egl_devices
        devices = egl_devices()
        assert isinstance(devices, list) and all(d is None or isinstance(d, int) for d in devices), devices
    """)
    assert proc.returncode == 0, proc.stderr


@needs_libero
def test_config_trap_is_seeded_by_the_package(tmp_path):
    """LIBERO_CONFIG_PATH set, no config there: the package writes one whose assets hold the scenes."""
    proc = run_python("""
        import os, yaml
        from pathlib import Path
        from topo.envs.libero import SCENE_FILE, seed_libero_config
        seed_libero_config()
        config = yaml.safe_load((Path(os.environ["LIBERO_CONFIG_PATH"]) / "config.yaml").read_text())
        assert (Path(config["assets"]) / SCENE_FILE).is_file(), config
    """, env={"LIBERO_CONFIG_PATH": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr


@needs_libero
def test_an_existing_config_is_left_alone_and_a_wrong_one_is_named(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"assets: '{tmp_path}'\n")
    proc = run_python("""
        from topo.envs.libero import prepare_libero
        prepare_libero()
    """, env={"LIBERO_CONFIG_PATH": str(tmp_path)})
    assert config.read_text() == f"assets: '{tmp_path}'\n"
    assert proc.returncode != 0 and "LIBERO assets not found" in proc.stderr and str(config) in proc.stderr


@needs_libero
def test_init_states_come_from_the_npz():
    from topo.backends.libero import suites
    from topo.envs.libero import load_init_states

    states = load_init_states("libero_spatial", 2)
    suite = suites()["libero_spatial"]
    with np.load(suite.init_states(suite.tasks[2])) as archive:
        expected = archive["states"]
    assert states.shape == (50, expected.shape[1]) and np.array_equal(states, expected)


@needs_libero
def test_init_states_left_to_torchrl_without_an_npz(monkeypatch, tmp_path):
    import libero.libero

    monkeypatch.setattr(libero.libero, "get_libero_path", lambda key: str(tmp_path))
    from topo.envs.libero import load_init_states

    assert load_init_states("libero_spatial", 0) is None
