"""Async mode's costs side by side: ready time against multi mode, and frames/s against the code before a change.

    python benchmarks/async_ab.py --old /path/to/checkout/before        # toy 1 x 16, 2 rounds, + real LIBERO 1 x 8
    python benchmarks/async_ab.py --old ../before --rounds 3 --no-libero

Every case is one ``benchmarks/step_loop.py --case`` run (a fresh process: the step loop shaped like production, its
env sleeping what real LIBERO takes), run with ``PYTHONPATH`` at this checkout or at ``--old``. Each round runs, one
after the other: multi (sync) and async on this checkout, async on ``--old``; then, with ``--libero`` (the default),
real LIBERO 1 x 8 with TinyVLA in multi and async mode (``step_loop.py --libero``). Ready is the time from
``topo.collector`` to its context (every env built), frames/s over ``--seconds`` after two warm-up batches.
Ratios are of medians over the rounds: ``async_over_multi_ready`` (this checkout), ``new_over_old_async_frames``.
Results: ``benchmarks/results/async_ab.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def case(root: str, spec: str, seconds: float, libero: bool) -> dict:
    """One ``step_loop.py --case`` in the checkout at ``root``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "benchmarks")]), "MUJOCO_GL": "egl"}
    python = os.path.join(ROOT, ".venv", "bin", "python")
    done = subprocess.run([python if os.path.exists(python) else sys.executable,
                           os.path.join(root, "benchmarks", "step_loop.py"), "--case", spec, "--seconds", str(seconds)]
                          + (["--libero"] if libero else []), env=env, capture_output=True, text=True, cwd=root)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        return {"case": spec, "error": done.stderr[-2000:]}
    return {"case": spec, **json.loads(lines[-1])}


def median(results: list[dict], key: str) -> float | None:
    values = [r[key] for r in results if key in r]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="a checkout of the code before (its own benchmarks/step_loop.py)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--topology", default="1x16")
    parser.add_argument("--no-libero", dest="libero", action="store_false")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "async_ab.json"))
    args = parser.parse_args()
    old = os.path.abspath(args.old)
    commits = {name: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                    text=True).stdout.strip() for name, root in (("new", ROOT), ("old", old))}
    runs: list[dict] = []
    for n in range(1, args.rounds + 1):
        plan = [("new", ROOT, f"sync:{args.topology}:0", False), ("new", ROOT, f"async:{args.topology}:0", False),
                ("old", old, f"async:{args.topology}:0", False)]
        if args.libero:
            plan += [("new", ROOT, "sync:1x8:0", True), ("new", ROOT, "async:1x8:0", True)]
        for code, root, spec, libero in plan:
            result = {"round": n, "code": code, "libero": libero, **case(root, spec, args.seconds, libero)}
            runs.append(result)
            print(json.dumps(result), flush=True)

    def of(code: str, mode: str, libero: bool) -> list[dict]:
        return [r for r in runs if r["code"] == code and r["case"].startswith(mode) and r["libero"] == libero]

    summary = {}
    for env_name, libero in (("toy", False), ("libero", True)):
        multi, asyn = of("new", "sync", libero), of("new", "async", libero)
        if not multi:
            continue
        ready_m, ready_a = median(multi, "ready_s"), median(asyn, "ready_s")
        summary[env_name] = {"multi_ready_s": [r.get("ready_s") for r in multi],
                             "async_ready_s": [r.get("ready_s") for r in asyn],
                             "async_over_multi_ready": round(ready_a / ready_m, 3) if ready_m and ready_a else None,
                             "multi_frames_per_s": [r.get("frames_per_s") for r in multi],
                             "async_frames_per_s": [r.get("frames_per_s") for r in asyn]}
    old_async = of("old", "async", False)
    new_f, old_f = median(of("new", "async", False), "frames_per_s"), median(old_async, "frames_per_s")
    summary["toy"].update(old_async_ready_s=[r.get("ready_s") for r in old_async],
                          old_async_frames_per_s=[r.get("frames_per_s") for r in old_async],
                          new_over_old_async_frames=round(new_f / old_f, 3) if new_f and old_f else None)
    out = {"what": __doc__.split("\n\n")[0].strip(), "commits": commits, "rounds": args.rounds,
           "seconds_per_case": args.seconds, "topology": args.topology, "host": os.uname().nodename,
           "cpus": os.cpu_count(), "load_average_at_end": os.getloadavg(),
           "date": time.strftime("%Y-%m-%d"), "summary": summary, "runs": runs}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
