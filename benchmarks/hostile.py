"""Hostile-input benchmark (issue 14): every hostile spec, template and plan of the tests, each through
the CLI in a fresh process, with its wall time and peak memory (its max RSS, from wait4).

    .venv/bin/python benchmarks/hostile.py   # writes benchmarks/results/hostile.json
Targets: each refused (exit 2, its code, no traceback) in < 2 s and < 200 MB. Also measured, for scale:
the largest inputs the limits still accept (a spec of just under MAX_NODES nodes, plain and by aliases).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "compiler"))

from hostile_inputs import HEAD, Case, argv, environment, write_all  # noqa: E402

from topo.limits import MAX_NODES  # noqa: E402

TARGET_S, TARGET_MB = 2.0, 200.0
# A child's max RSS counts what it held before exec: forked from this process it would start at this
# process's size. So a bare Python (-S, a few MB) forks the command and reports its wait4 figures.
LAUNCHER = """
import json, os, sys, time
out = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
print(json.dumps([os.waitstatus_to_exitcode(status), time.perf_counter() - start, usage.ru_maxrss]))
"""


def measure(case: Case, folder: Path) -> dict:
    log = folder / "output.txt"
    launched = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, str(log), *argv(case)], env=environment(),
                              capture_output=True, text=True, check=True)
    exit_code, wall, rss_kb = json.loads(launched.stdout)
    out = log.read_text()
    return {
        "case": case.name, "command": " ".join(a if len(a) < 60 else a[:40] + "..." for a in case.argv),
        "exit_code": exit_code, "code": case.code, "refused_as_expected": exit_code == 2
        and f"error {case.code}" in out and case.says in out and "Traceback" not in out,
        "wall_s": round(wall, 3), "peak_rss_mb": round(rss_kb / 1024, 1),
        "message": next((line for line in out.splitlines() if f"error {case.code}" in line), out[:300]),
    }


def largest_accepted(folder: Path) -> list[Case]:
    """Inputs just under the node limit: validated (exit 2 only for their unknown key), for scale."""
    items = MAX_NODES - 20
    plain = folder / "just_under.yaml"
    plain.write_text(HEAD + "x: [" + ",".join("0" * items) + "]\n")
    anchor = "a: &a [" + ",".join("0" * 999) + "]\n"
    aliased = folder / "just_under_aliases.yaml"
    aliased.write_text(HEAD + anchor + "x: [" + ", ".join(["*a"] * ((MAX_NODES - 1100) // 1000)) + "]\n")
    return [Case(f"accepted-{items}-nodes", ("validate", str(plain)), "schema-unknown-key", "unknown key 'x'"),
            Case("accepted-aliases-to-limit", ("validate", str(aliased)), "schema-unknown-key", "unknown key 'a'")]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="topo-hostile-") as folder:
        runs = [measure(case, Path(folder)) for case in write_all(Path(folder))]
        scale = [measure(case, Path(folder)) for case in largest_accepted(Path(folder))]
    worst_s = max(r["wall_s"] for r in runs)
    worst_mb = max(r["peak_rss_mb"] for r in runs)
    results = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "load_average": os.getloadavg()},
        "targets": {"wall_s": TARGET_S, "peak_rss_mb": TARGET_MB},
        "met": {"all_refused": all(r["refused_as_expected"] for r in runs),
                "wall_s": worst_s < TARGET_S, "peak_rss_mb": worst_mb < TARGET_MB},
        "worst": {"wall_s": worst_s, "peak_rss_mb": worst_mb},
        "hostile": runs,
        "largest_accepted": scale,
    }
    out = ROOT / "benchmarks" / "results" / "hostile.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    for r in runs + scale:
        print(f"{r['case']:<28} exit {r['exit_code']}  {r['wall_s']:6.2f} s  {r['peak_rss_mb']:7.1f} MB  "
              f"{'ok' if r['refused_as_expected'] else 'UNEXPECTED'}")
    print(json.dumps({k: results[k] for k in ("met", "worst")}))


if __name__ == "__main__":
    main()
