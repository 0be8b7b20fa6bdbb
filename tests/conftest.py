"""Every test, and every process a test starts, caches compiled MuJoCo models in one temporary directory
of the session, never in the user's cache; it is deleted at the end (a LIBERO scene's entry is ~260 MB).

The fast tier (``bash scripts/test --fast``, which is ``pytest -m fast``) is :data:`FAST`, marked here."""
import os
import shutil
import subprocess
import sys
import time
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
#: the fifteen longest of a clean-clone run with nothing else running (2026-12-07, ``16d5b2e``: 784 s down to 81 s),
#: then the files ranked after them before, in that ranking
LONGEST_FIRST = ("tests/ray/test_ray_training.py", "tests/launch/test_evaluation.py", "tests/bench/test_bench.py",
                 "tests/libero/test_libero_options.py", "tests/ray/test_ray_auth.py",
                 "tests/launch/test_training_api.py", "tests/launch/test_restarts.py",
                 "tests/launch/test_launch_faults.py", "tests/launch/test_async_mode.py",
                 "tests/launch/test_watch_run.py", "tests/libero/test_chunked_libero.py",
                 "tests/launch/test_resume.py", "tests/libero/test_eval_libero.py", "tests/launch/test_launch.py",
                 "tests/launch/test_background.py", "tests/launch/test_fault_fuzz.py",
                 "tests/launch/test_reproducible.py", "tests/launch/test_recycle.py",
                 "tests/launch/test_transforms_launch.py", "tests/libero/test_two_suites_libero.py",
                 "tests/launch/test_certificate.py", "tests/launch/test_plugin_backend.py", "tests/docs/test_blocks.py",
                 "tests/libero/test_libero_doctor.py", "tests/launch/test_stall.py", "tests/launch/test_chaos_soak.py",
                 "tests/libero/test_libero_build.py", "tests/libero/test_train_libero.py",
                 "tests/launch/test_recipe_dropin.py", "tests/libero/test_launch_libero.py",
                 "tests/launch/test_gl.py")

#: the day's speed: how long a fresh interpreter takes to run this (README quotes it with every suite figure)
REFERENCE_IMPORT = "import torch, torchrl.envs, torchrl.collectors"
#: ``scripts/test --durations``: each file's budget in seconds (its tests' setup, call and teardown, summed) on a day
#: when :data:`REFERENCE_IMPORT` took :data:`CALIBRATED_IMPORT_S`, with nothing else running: 1.25 x the longer of
#: two such runs (2026-12-07: a clean clone of ``16d5b2e``, and the tree at ``b411168``), for the fifteen longest files
#: of either; any other file :data:`BUDGET_S`. A file past its budget, and a test past :data:`LONG_TEST_S` without a
#: docstring (to say why), are printed at the end.
BUDGETS_S = {"tests/ray/test_ray_training.py": 980,
             # re-derived from 418c9d9's idle run (288.6 s at 6.7 s): 43667d4's between-rounds kills added eval runs
             "tests/launch/test_evaluation.py": 455,
             "tests/bench/test_bench.py": 275, "tests/libero/test_libero_options.py": 270,
             "tests/ray/test_ray_auth.py": 230, "tests/launch/test_training_api.py": 220,
             "tests/launch/test_restarts.py": 215, "tests/launch/test_launch_faults.py": 200,
             "tests/launch/test_async_mode.py": 190, "tests/launch/test_watch_run.py": 170,
             "tests/libero/test_chunked_libero.py": 155, "tests/launch/test_resume.py": 150,
             "tests/libero/test_eval_libero.py": 145,
             "tests/launch/test_fault_fuzz.py": 180}  # issue 46's fuzz: a start, 36 s of faults, the recoveries
BUDGET_S = 120
CALIBRATED_IMPORT_S = 9.1
#: the share of a file's time that does not follow the machine's speed (deadlines, sleeps, waits on other
#: processes): two clean-clone runs of the whole suite, 21 min 23 s with the reference at 2.9-4.0 s and 40 min 55 s
#: at 8.4-9.4 s, fit ``a + b x import`` with ``a`` a fifth of the slow run
FIXED_SHARE = 0.2
#: the reference import's time in seconds, given rather than measured (a test of the report, or a known day)
IMPORT_VAR = "TOPO_TEST_IMPORT_S"
LONG_TEST_S = 30


def budget(path: str, import_s: float = CALIBRATED_IMPORT_S) -> float:
    """``path``'s budget in seconds on a day when :data:`REFERENCE_IMPORT` takes ``import_s``."""
    return BUDGETS_S.get(path, BUDGET_S) * (FIXED_SHARE + (1 - FIXED_SHARE) * import_s / CALIBRATED_IMPORT_S)


def reference_import_s() -> float | None:
    """The day's speed, measured now (the tests have ended): the faster of two fresh interpreters, or None if the
    import fails or takes past 5 minutes."""
    given = os.environ.get(IMPORT_VAR)
    if given:
        return float(given)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", REFERENCE_IMPORT], capture_output=True, timeout=300)
        except subprocess.TimeoutExpired:
            return None
        if done.returncode:
            return None
        times.append(time.perf_counter() - start)
    return min(times)


def pytest_addoption(parser):
    parser.addoption("--file-durations", action="store_true",
                     help="print the slowest files, tests and setups, and each file over its budget (BUDGETS_S)")


def pytest_configure(config):
    if config.getoption("file_durations"):
        config.pluginmanager.register(Durations(), "topo-file-durations")


class Durations:
    """Sums each file's per-test durations (the reports reach the xdist controller too) and prints them."""

    def __init__(self):
        self.files: dict[str, float] = {}
        self.tests: dict[str, float] = {}
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
        self.tests[report.nodeid] = self.tests.get(report.nodeid, 0.0) + report.duration
        if report.when == "setup":
            self.setups.append((report.duration, report.nodeid))
        elif report.when == "call" and report.duration > LONG_TEST_S:
            if not dict(report.user_properties).get("documented"):
                self.unexplained.append((report.duration, report.nodeid))

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter):
        write = terminalreporter.write_line
        terminalreporter.section("slowest files and tests (setup + call + teardown), and setups")
        import_s = reference_import_s()
        if import_s is None:
            write(f"the day's speed: {REFERENCE_IMPORT!r} failed; budgets as on the day they were set", red=True)
            import_s = CALIBRATED_IMPORT_S
        else:
            write(f"the day's speed: {REFERENCE_IMPORT!r} in {import_s:.1f} s (budgets set at "
                  f"{CALIBRATED_IMPORT_S} s, nothing else running; tests/conftest.py BUDGETS_S)")
        for seconds, name in sorted(((s, f) for f, s in self.files.items()), reverse=True)[:15]:
            write(f"{seconds:8.1f}s  {name}  (budget {budget(name, import_s):.0f}s)")
        for seconds, name in sorted(((s, t) for t, s in self.tests.items()), reverse=True)[:15]:
            write(f"{seconds:8.1f}s  {name}")
        for seconds, name in sorted(self.setups, reverse=True)[:10]:
            write(f"{seconds:8.1f}s  setup of {name}")
        over = sorted((s, f) for f, s in self.files.items() if s > budget(f, import_s))
        for seconds, name in over[::-1]:
            write(f"OVER BUDGET: {name} took {seconds:.1f}s, its budget {budget(name, import_s):.0f}s at today's "
                  "speed (tests/conftest.py BUDGETS_S)", red=True, bold=True)
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
