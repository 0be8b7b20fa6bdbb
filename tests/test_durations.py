"""``scripts/test --durations`` (:class:`tests.conftest.Durations`): per-test reports summed by file, the slowest
setups, a file over its budget and a long test without a docstring named at the end."""
from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import BUDGET_S, BUDGETS_S, LONG_TEST_S, Durations


class Terminal:
    def __init__(self):
        self.lines: list[tuple[str, dict]] = []

    def section(self, title: str) -> None:
        self.lines.append((title, {}))

    def write_line(self, line: str, **markup) -> None:
        self.lines.append((line, markup))


def report(nodeid: str, when: str, duration: float, documented: bool = True) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, when=when, duration=duration, user_properties=[("documented", documented)])


def test_files_are_summed_and_those_over_budget_or_long_without_a_docstring_are_named():
    durations, terminal = Durations(), Terminal()
    long, other = "tests/bench/test_bench.py", "tests/launch/test_x.py"
    for r in (report(f"{long}::test_a", "setup", 100.0), report(f"{long}::test_a", "call", 80.0),
              report(f"{long}::test_a", "teardown", 1.0), report(f"{other}::test_b", "setup", 0.5),
              report(f"{other}::test_b", "call", LONG_TEST_S + 1, documented=False),
              report(f"{other}::test_c", "call", LONG_TEST_S + 2)):
        durations.pytest_runtest_logreport(r)
    durations.pytest_terminal_summary(terminal)
    text = [line for line, _ in terminal.lines]
    assert text[1:3] == [f"   181.0s  {long}  (budget {BUDGETS_S[long]}s)", f"    63.5s  {other}  (budget {BUDGET_S}s)"]
    assert text[3] == f"   100.0s  setup of {long}::test_a"
    alarms = [(line, markup) for line, markup in terminal.lines if markup]
    assert alarms == [(f"OVER BUDGET: {long} took 181.0s, its budget {BUDGETS_S[long]}s (tests/conftest.py BUDGETS_S)",
                       {"red": True, "bold": True}),
                      (f"LONG, NO DOCSTRING: {other}::test_b took 31.0s (over 30s: a docstring says why)",
                       {"red": True, "bold": True})]
