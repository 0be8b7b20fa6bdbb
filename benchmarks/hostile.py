"""Hostile-input benchmark (issue 14): every hostile spec, template and plan of the tests, each through
the CLI in a fresh process, with its wall time and peak memory (its max RSS, from wait4).

    .venv/bin/python benchmarks/hostile.py   # writes benchmarks/results/hostile.json
Targets: each refused (exit 2, its code, no traceback) in < 2 s and < 200 MB. Also measured, for scale:
the largest inputs the limits still accept (specs of just under MAX_NODES nodes, with aliases or without).
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
sys.path.insert(0, str(ROOT))

from tests.compiler.hostile_inputs import Case, argv, environment, write_all  # noqa: E402

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
        "exit_code": exit_code, "code": case.code or None, "as_expected": case.says in out and "Traceback" not in out
        and (exit_code == 2 and f"error {case.code}" in out if case.code else exit_code == 0),
        "wall_s": round(wall, 3), "peak_rss_mb": round(rss_kb / 1024, 1),
        "message": next((line for line in out.splitlines() if f"error {case.code}" in line), out[:300]),
    }


def largest_accepted(folder: Path) -> list[Case]:
    """Valid specs just under the node limit: 35,000 one-worker blocks (245,017 nodes), and 245 aliases
    of a 1,000-item anchor in env kwargs (247,018 nodes from 6 KB)."""
    blocks = {"version": 1, "env": {"backend": "toy"}, "topology": {"subcollectors": 10, "workers_per_subcollector": 3500},
              "assignment": {"blocks": [{"task": g % 10, "workers": 1, "instruction": f"w{g}"} for g in range(35_000)]}}
    (folder / "blocks.yaml").write_text(json.dumps(blocks))
    aliased = folder / "aliases.yaml"
    aliased.write_text("version: 1\ntopology: {subcollectors: 1, workers_per_subcollector: 1}\nenv:\n  backend: toy\n"
                       "  kwargs:\n    a: &a [" + ",".join("0" * 999) + "]\n    x: [" + ", ".join(["*a"] * 245) + "]\n")
    return [Case("accepted-35000-blocks", ("validate", str(folder / "blocks.yaml")), "", "valid"),
            Case("accepted-245-aliases", ("validate", str(aliased)), "", "valid")]


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
        "met": {"all_refused": all(r["as_expected"] for r in runs),
                "wall_s": worst_s < TARGET_S, "peak_rss_mb": worst_mb < TARGET_MB},
        "worst": {"wall_s": worst_s, "peak_rss_mb": worst_mb},
        "hostile": runs,
        "largest_accepted": scale,
    }
    out = ROOT / "benchmarks" / "results" / "hostile.json"
    out.write_text(json.dumps(results, indent=1) + "\n")
    for r in runs + scale:
        print(f"{r['case']:<28} exit {r['exit_code']}  {r['wall_s']:6.2f} s  {r['peak_rss_mb']:7.1f} MB  "
              f"{'ok' if r['as_expected'] else 'UNEXPECTED'}")
    print(json.dumps({k: results[k] for k in ("met", "worst")}))


if __name__ == "__main__":
    main()
