"""Plan-time LIBERO knowledge, read from the package's files without importing it."""
import numpy as np
import pytest

from topo.backends.libero import STANDARD_SUITES, count_init_states, suite_catalog, suites, task_language

from tests.libero.libero_helpers import needs_libero, run_python

SPATIAL_0 = "pick up the black bowl between the plate and the ramekin and place it on the plate"


@needs_libero
def test_standard_suites_and_their_sizes():
    assert set(STANDARD_SUITES) <= set(suites())
    for name in ("libero_spatial", "libero_object", "libero_goal", "libero_10"):
        assert suite_catalog(name).ids == tuple(range(10))
    assert suite_catalog("libero_90").ids == tuple(range(90))


@needs_libero
def test_spatial_catalog_language_and_init_states():
    catalog = suite_catalog("libero_spatial")
    assert catalog.language[0] == SPATIAL_0
    assert catalog.init_states == {i: 50 for i in range(10)}
    assert "libero_spatial" in catalog.source
    assert suite_catalog("no_such_suite") is None


@needs_libero
def test_catalog_agrees_with_libero_benchmark_for_every_suite():
    """Same suites, task order, language and init-state counts as libero's own (imported) benchmark."""
    proc = run_python("""
        import json
        from libero.libero import benchmark
        out = {}
        for key, cls in benchmark.get_benchmark_dict().items():
            suite = cls()
            out[key] = [[t.name, t.language] for t in suite.tasks]
            out[key + "/states"] = len(suite.get_task_init_states(0)) if key == "libero_90" else None
        print("JSON" + json.dumps(out))
    """, timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = __import__("json").loads(proc.stdout.split("JSON", 1)[1])
    assert sorted(suites()) == sorted(k for k in expected if "/" not in k)
    for key, suite in suites().items():
        assert [list(p) for p in zip(suite.tasks, suite_catalog(key).language.values())] == expected[key], key
    assert suite_catalog("libero_90").init_states[0] == expected["libero_90/states"]


@needs_libero
def test_reading_the_catalog_imports_nothing_heavy():
    proc = run_python("""
        import sys
        from topo.backends.libero import LiberoBackend
        b = LiberoBackend()
        b.check({"task_suite": "libero_90"}, ("env", "kwargs"))
        assert b.catalog({"task_suite": "libero_90"}).init_states[89] == 50
        heavy = [m for m in ("torch", "numpy", "robosuite", "mujoco", "libero", "torchrl") if m in sys.modules]
        assert not heavy, heavy
    """)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name, language", [
    ("pick_up_the_black_bowl", "pick up the black bowl"),
    ("KITCHEN_SCENE3_turn_on_the_stove", "turn on the stove"),
    ("KITCHEN_SCENE10_put_the_butter_at_the_back", "put the butter at the back"),
    ("LIVING_ROOM_SCENE2_pick_up_the_ketchup", "pick up the ketchup"),
    ("open_it(yellow_plate).bddl", "open it(yellow plate)"),
])
def test_task_language_follows_libero_naming(name, language):
    assert task_language(name) == language


@pytest.mark.parametrize("compress", [False, True])
def test_init_state_count_from_the_npy_header(tmp_path, compress):
    path = tmp_path / "t.pruned_init.npz"
    (np.savez_compressed if compress else np.savez)(path, states=np.zeros((37, 79)))
    assert count_init_states(path) == 37


def test_unreadable_init_states_have_no_count(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    np.savez(tmp_path / "other.npz", other=np.zeros(3))
    assert count_init_states(tmp_path / "bad.npz") is None
    assert count_init_states(tmp_path / "other.npz") is None
    assert count_init_states(tmp_path / "missing.npz") is None
