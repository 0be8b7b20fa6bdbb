"""``scripts/test --durations`` (:class:`tests.conftest.Durations`): per-test reports summed by file and by
test, the slowest setups, a file over its budget and a long test without a docstring named at the end."""
from __future__ import annotations

from types import SimpleNamespace

from tests import conftest
from tests.conftest import (BUDGET_S, BUDGETS_S, CALIBRATED_IMPORT_S, FIXED_SHARE, IMPORT_VAR, LONG_TEST_S,
                            REFERENCE_IMPORT, Durations, budget)


class Terminal:
    def __init__(self):
        self.lines: list[tuple[str, dict]] = []

    def section(self, title: str) -> None:
        self.lines.append((title, {}))

    def write_line(self, line: str, **markup) -> None:
        self.lines.append((line, markup))


def report(nodeid: str, when: str, duration: float, documented: bool = True) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, user_properties=[("documented", documented)])


def summary(monkeypatch, import_s: str | None, reference: str | None = None) -> list[tuple[str, dict]]:
    """The report of one long file, one short one with a long undocumented test, the day's import taking
    ``import_s`` (None: measured, of ``reference``)."""
    if import_s is None:
        monkeypatch.delenv(IMPORT_VAR, raising=False)
        monkeypatch.setattr(conftest, "REFERENCE_IMPORT", reference)
    else:
        monkeypatch.setenv(IMPORT_VAR, import_s)
    durations, terminal = Durations(), Terminal()
    for r in (report(f"{LONG}::test_a", "setup", 100.0), report(f"{LONG}::test_a", "call", 80.0),
              report(f"{LONG}::test_a", "teardown", 1.0), report(f"{OTHER}::test_b", "setup", 0.5),
              report(f"{OTHER}::test_b", "call", LONG_TEST_S + 1, documented=False),
              report(f"{OTHER}::test_c", "call", LONG_TEST_S + 2)):
        durations.pytest_runtest_logreport(r)
    durations.pytest_terminal_summary(terminal)
    return terminal.lines


LONG, OTHER = "tests/bench/test_bench.py", "tests/launch/test_x.py"
UNDOCUMENTED = (f"LONG, NO DOCSTRING: {OTHER}::test_b took 31.0s (over 30s: a docstring says why)",
                {"red": True, "bold": True})


def test_files_are_summed_and_those_over_budget_or_long_without_a_docstring_are_named(monkeypatch):
    lines = summary(monkeypatch, str(CALIBRATED_IMPORT_S))
    text = [line for line, _ in lines]
    assert text[1].startswith(f"the day's speed: '{REFERENCE_IMPORT}' in {CALIBRATED_IMPORT_S} s (budgets set at ")
    assert text[2:4] == [f"   181.0s  {LONG}  (budget {BUDGETS_S[LONG]}s)", f"    63.5s  {OTHER}  (budget {BUDGET_S}s)"]
    assert text[4:8] == [f"   181.0s  {LONG}::test_a", f"    32.0s  {OTHER}::test_c", f"    31.5s  {OTHER}::test_b",
                         f"   100.0s  setup of {LONG}::test_a"]
    assert [(line, markup) for line, markup in lines if markup] == [UNDOCUMENTED]  # 181 s: within 275 s


def test_budgets_follow_the_day_s_speed_all_but_their_fixed_share(monkeypatch):
    """At half the calibration day's import time, a budget is FIXED_SHARE + (1 - FIXED_SHARE) / 2 of its figure:
    181 s is over the bench's then."""
    lines = summary(monkeypatch, str(CALIBRATED_IMPORT_S / 2))
    scaled = BUDGETS_S[LONG] * (FIXED_SHARE + (1 - FIXED_SHARE) / 2)
    assert 100 < scaled < 181 and budget(LONG, CALIBRATED_IMPORT_S / 2) == scaled
    assert f"   181.0s  {LONG}  (budget {scaled:.0f}s)" in [line for line, _ in lines]
    assert [(line, markup) for line, markup in lines if markup] == [
        (f"OVER BUDGET: {LONG} took 181.0s, its budget {scaled:.0f}s at today's speed (tests/conftest.py BUDGETS_S)",
         {"red": True, "bold": True}), UNDOCUMENTED]


def test_the_day_s_speed_is_measured_in_fresh_interpreters_and_a_failed_import_is_said(monkeypatch):
    measured = [line for line, _ in summary(monkeypatch, None, "pass")][1]
    assert measured.startswith("the day's speed: 'pass' in ") and float(measured.split(" in ")[1].split()[0]) < 60
    lines = summary(monkeypatch, None, "raise SystemExit(3)")
    assert lines[1] == ("the day's speed: 'raise SystemExit(3)' failed; budgets as on the day they were set",
                        {"red": True})
    assert f"   181.0s  {LONG}  (budget {BUDGETS_S[LONG]}s)" in [line for line, _ in lines]
