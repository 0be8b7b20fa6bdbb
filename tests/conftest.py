"""Every test, and every process a test starts, caches compiled MuJoCo models in one temporary directory
of the session, never in the user's cache; it is deleted at the end (a LIBERO scene's entry is ~260 MB).

The fast tier (``bash scripts/test --fast``, which is ``pytest -m fast``) is :data:`FAST`, marked here."""
import os
import shutil
from pathlib import Path

import pytest

from topo.runtime.model_cache import CACHE_VAR


@pytest.fixture(scope="session", autouse=True)
def session_model_cache(tmp_path_factory):
    saved = os.environ.get(CACHE_VAR)
    directory = str(tmp_path_factory.mktemp("model-cache"))
    os.environ[CACHE_VAR] = directory
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
    if saved is None:
        os.environ.pop(CACHE_VAR, None)
    else:
        os.environ[CACHE_VAR] = saved


# The fast tier, declared here only: the compiler, the rules, the API surface (tests/compiler), the launch's and
# the bench's unit tests (no process started), and one toy launch: the README's quickstart, run as written. Each
# entry is a folder (ending in /), a file, or one test; an entry that names nothing any more fails the run.
FAST = (
    "tests/compiler/",
    "tests/launch/test_launch_units.py",
    "tests/launch/test_recovery_units.py",
    "tests/launch/test_supervision_units.py",
    "tests/launch/test_recycle_units.py",
    "tests/launch/test_stall_units.py",
    "tests/launch/test_live_units.py",
    "tests/launch/test_figures_units.py",
    "tests/launch/test_boundary.py",
    "tests/launch/test_server_slots.py",
    "tests/launch/test_time_breakdown_units.py",
    "tests/launch/test_evaluation_units.py",
    "tests/launch/test_resume_units.py",
    "tests/launch/test_provenance_units.py",
    "tests/launch/test_records_units.py",
    "tests/launch/test_clean_ends_units.py",
    "tests/launch/test_reproducible_units.py",
    "tests/launch/test_hostile_files.py::test_the_recorded_run_replays_bit_for_bit",
    "tests/launch/test_hostile_files.py::test_a_hostile_run_file_is_refused",
    "tests/launch/test_hostile_files.py::test_a_checkpoint_that_is_not_weights_is_refused_and_never_run",
    "tests/launch/test_async_units.py",
    "tests/launch/test_transforms_units.py",
    "tests/launch/test_script_events.py",
    "tests/bench/test_bench_units.py",
    "tests/estimate/test_estimate_units.py",
    "tests/docs/test_pages.py",
    "tests/ray/test_ray_units.py",
    "tests/ray/test_ray_doctor_units.py",
    "tests/ray/test_ray_auth_units.py",
    "tests/launch/test_training_api.py::test_the_quickstart_runs_as_written",
)
ROOT = Path(__file__).resolve().parent.parent


def _in_fast(nodeid: str, entry: str) -> bool:
    return nodeid.startswith(entry) if entry.endswith("/") else nodeid == entry or nodeid.startswith((entry + "::", entry + "["))


#: the files that take longest, collected first (each keeps its tests' order): under pytest-xdist's loadfile,
#: the long ones start at once instead of one of them ending the run while the other process idles
LONGEST_FIRST = ("tests/ray/test_ray_training.py", "tests/launch/test_restarts.py", "tests/launch/test_evaluation.py",
                 "tests/libero/test_libero_options.py", "tests/bench/test_bench.py", "tests/launch/test_training_api.py",
                 "tests/launch/test_launch_faults.py", "tests/launch/test_launch.py", "tests/launch/test_background.py",
                 "tests/launch/test_resume.py",
                 "tests/ray/test_ray_launch.py", "tests/launch/test_stall.py", "tests/ray/test_ray_doctor.py",
                 "tests/launch/test_reproducible.py", "tests/launch/test_recycle.py", "tests/launch/test_chaos_soak.py", "tests/libero/test_libero_build.py",
                 "tests/libero/test_eval_libero.py", "tests/libero/test_train_libero.py",
                 "tests/libero/test_launch_libero.py")  # by their summed durations in a whole-suite run, longest first


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    missing = [entry for entry in FAST if not (ROOT / entry.split("::")[0]).exists()]
    matched = set()
    for item in items:
        for entry in FAST:
            if _in_fast(item.nodeid, entry):
                item.add_marker(pytest.mark.fast)
                matched.add(entry)
    if "fast" in (config.getoption("markexpr") or ""):  # a test named in FAST, its file collected, not found
        collected = {item.nodeid.split("::")[0] for item in items}
        missing += [e for e in FAST if "::" in e and e not in matched and e.split("::")[0] in collected]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py FAST names tests that do not exist: {', '.join(missing)}")
