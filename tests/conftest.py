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
    "tests/launch/test_paired_units.py",
    "tests/launch/test_certificate_units.py",
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
    "tests/bench/test_gpu_check.py",
    "tests/estimate/test_estimate_units.py",
    "tests/docs/test_pages.py",
    "tests/test_durations.py",
    "tests/ray/test_ray_units.py",
    "tests/ray/test_ray_doctor_units.py",
    "tests/ray/test_ray_auth_units.py",
    "tests/launch/test_training_api.py::test_the_quickstart_runs_as_written",
)
ROOT = Path(__file__).resolve().parent.parent


def _in_fast(nodeid: str, entry: str) -> bool:
    return nodeid.startswith(entry) if entry.endswith("/") else nodeid == entry or nodeid.startswith((entry + "::", entry + "["))


#: the files that take longest, collected first (each keeps its tests' order): under pytest-xdist's loadfile,
#: the long ones start at once instead of one of them ending the run while the other process idles. Longest first:
#: the fifteen longest of a whole-suite run's ``--durations`` (2026-12-06, a clean clone beside two Ray runs: 403 s
#: down to 89 s), then the files ranked after them before (a run of 2026-12-05, and one of the files added since),
#: in that ranking
LONGEST_FIRST = ("tests/launch/test_restarts.py", "tests/ray/test_ray_training.py",
                 "tests/launch/test_background.py", "tests/launch/test_training_api.py",
                 "tests/launch/test_async_mode.py", "tests/launch/test_watch_run.py",
                 "tests/launch/test_evaluation.py", "tests/launch/test_launch_faults.py",
                 "tests/launch/test_resume.py", "tests/libero/test_libero_options.py",
                 "tests/libero/test_eval_libero.py", "tests/bench/test_bench.py", "tests/launch/test_fault_fuzz.py",
                 "tests/launch/test_reproducible.py", "tests/launch/test_recycle.py",
                 "tests/launch/test_transforms_launch.py", "tests/libero/test_two_suites_libero.py",
                 "tests/libero/test_chunked_libero.py", "tests/launch/test_certificate.py",
                 "tests/launch/test_launch.py", "tests/launch/test_plugin_backend.py", "tests/docs/test_blocks.py",
                 "tests/ray/test_ray_auth.py", "tests/libero/test_libero_doctor.py",
                 "tests/launch/test_stall.py", "tests/launch/test_chaos_soak.py",
                 "tests/libero/test_libero_build.py", "tests/libero/test_train_libero.py",
                 "tests/launch/test_recipe_dropin.py", "tests/libero/test_launch_libero.py",
                 "tests/launch/test_gl.py")


#: ``scripts/test --durations``: each file's budget in seconds (its tests' setup, call and teardown, summed), the five
#: longest at their figures in a whole-suite run (2026-12-05, issue 47), any other file :data:`BUDGET_S`; a file past
#: its budget, and a test past :data:`LONG_TEST_S` without a docstring (to say why), are printed at the end.
#: test_ray_training's 400 s scaled by what its forkserver workers saved it side by side with the spawned ones
#: (667.3 s -> 598.0 s, 2026-12-06; 506.8 s -> 353.4 s one after the other, the load differing), plus what
#: test_ray_doctor.py's cluster tests (69 s) and test_ray_async.py (57 s) took beside it (2026-12-07) less the
#: cluster starts they no longer make
BUDGETS_S = {"tests/ray/test_ray_training.py": 450, "tests/launch/test_restarts.py": 400,
             "tests/launch/test_evaluation.py": 215, "tests/libero/test_libero_options.py": 190,
             "tests/bench/test_bench.py": 175,
             "tests/launch/test_fault_fuzz.py": 180}  # issue 46's fuzz: a start, 36 s of faults, the recoveries
BUDGET_S = 120
LONG_TEST_S = 30


def budget(path: str) -> float:
    return BUDGETS_S.get(path, BUDGET_S)


def pytest_addoption(parser):
    parser.addoption("--file-durations", action="store_true",
                     help="print the slowest files and setups, and each file over its budget (BUDGETS_S)")


def pytest_configure(config):
    if config.getoption("file_durations"):
        config.pluginmanager.register(Durations(), "topo-file-durations")


class Durations:
    """Sums each file's per-test durations (the reports reach the xdist controller too) and prints them."""

    def __init__(self):
        self.files: dict[str, float] = {}
        self.setups: list[tuple[float, str]] = []
        self.unexplained: list[tuple[float, str]] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        if call.when == "call":  # in the process that ran it: whether its docstring can say why it is long
            outcome.get_result().user_properties.append(("documented", bool(getattr(item.obj, "__doc__", None))))

    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split("::")[0]
        self.files[path] = self.files.get(path, 0.0) + report.duration
        if report.when == "setup":
            self.setups.append((report.duration, report.nodeid))
        elif report.when == "call" and report.duration > LONG_TEST_S:
            if not dict(report.user_properties).get("documented"):
                self.unexplained.append((report.duration, report.nodeid))

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        terminalreporter.section("slowest files (setup + call + teardown) and setups")
        for seconds, name in sorted(((s, f) for f, s in self.files.items()), reverse=True)[:15]:
            write(f"{seconds:8.1f}s  {name}  (budget {budget(name)}s)")
        for seconds, name in sorted(self.setups, reverse=True)[:10]:
            write(f"{seconds:8.1f}s  setup of {name}")
        over = sorted((s, f) for f, s in self.files.items() if s > budget(f))
        for seconds, name in over[::-1]:
            write(f"OVER BUDGET: {name} took {seconds:.1f}s, its budget {budget(name)}s "
                  "(tests/conftest.py BUDGETS_S)", red=True, bold=True)
        for seconds, name in sorted(self.unexplained, reverse=True):
            write(f"LONG, NO DOCSTRING: {name} took {seconds:.1f}s (over {LONG_TEST_S}s: a docstring says why)",
                  red=True, bold=True)


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
