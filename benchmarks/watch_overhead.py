"""What watching a run costs it, side by side: frames per second with ``topo top`` and torchrl's logger on and off.

    python benchmarks/watch_overhead.py            # toy 2 x 4, TinyVLA, 3 rounds (a few minutes)

Cases (a fresh process each, rounds alternating: ``side_by_side.alternate``), each ``--batches`` timed batches
(``side_by_side.timed``: collect, an optimizer step, a weight push) after ``--warmup`` batches, on one topo run:

- ``plain``: nothing watches it;
- ``top``: a ``topo top RUN --interval 1`` process refreshes the live view beside it, for the whole run;
- ``logger``: the run's figures go to torchrl's ``CSVLogger`` (``topo.collector(logger=...)``, read every 10 s, its default);
- ``both``: the two at once.

The issue's target: each watched case within 1 % of ``plain``. Beside frames/s, which varies a few % between
rounds here, the CPU each watcher took (``top_cpu_s``: the ``topo top`` process from start to end;
``figures_cpu_s``: the logger's thread over the timed batches), and that CPU as a share of the machine's over the
timed batches (``cpu_share_median``; top's counts its whole life, so it is an upper bound): a watcher cannot slow
a CPU-bound run by more than the CPU it takes from it. Results: ``benchmarks/results/watch_overhead.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from side_by_side import TOY_2X4, alternate, timed

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("plain", "top", "logger", "both")


def case(name: str, warmup: int, batches: int) -> dict:
    """One case in this process: the timed batches' frames, seconds and frames per second."""
    import yaml
    from torchrl.record.loggers import CSVLogger

    import topo

    with tempfile.TemporaryDirectory() as tmp:
        spec = os.path.join(tmp, "spec.yaml")
        with open(spec, "w") as f:
            yaml.safe_dump({**TOY_2X4, "collector": {"frames_per_batch": 64}}, f)
        plan = topo.load(spec)
        policy = plan.make_policy()
        logger = CSVLogger("run", log_dir=os.path.join(tmp, "logs")) if name in ("logger", "both") else None
        report = os.path.join(tmp, "report")
        with topo.collector(plan, policy=policy, progress=False, report_dir=report, logger=logger) as run:
            top = None
            if name in ("top", "both"):
                top = subprocess.Popen([sys.executable, "-m", "topo", "top", report, "--interval", "1"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                timed(run, policy, warmup)
                figures_cpu = _thread_cpu_s("topo-figures")
                result = timed(run, policy, batches)
                if logger is not None:  # the logger's thread, in this process: its CPU over the timed batches
                    result["figures_cpu_s"] = round(_thread_cpu_s("topo-figures") - figures_cpu, 3)
            finally:
                if top is not None:
                    refreshed = top.poll() is None  # it watched the whole run
                    top.terminate()
                    _, _, usage = os.wait4(top.pid, 0)
                    top.returncode = 0
        if top is not None and not refreshed:
            sys.exit("topo top ended before the run did")
        if top is not None:  # the CPU it took from the run, from its start (with the warmup) to its end
            result["top_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    return {"case": name, **result}


def _thread_cpu_s(name: str) -> float:
    """The CPU seconds the thread ``name`` of this process has used (0.0 without one)."""
    import threading

    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "watch_overhead.json"))
    args = parser.parse_args()
    sizes = ["--warmup", str(args.warmup), "--batches", str(args.batches)]
    if args.case:
        print(json.dumps(case(args.case, args.warmup, args.batches)))
        return
    runs = alternate(os.path.abspath(__file__), CASES, args.rounds, sizes)
    median = {name: statistics.median(r["frames_per_s"] for r in results) for name, results in runs.items()}
    cpu = {key: statistics.median(r[key] for r in runs[name] if key in r)
           for key, name in (("top_cpu_s", "top"), ("figures_cpu_s", "logger"))}
    share = {name: statistics.median(r.get(key, 0.0) / (os.cpu_count() * r["wall_s"]) for r in runs[name])
             for key, name in (("top_cpu_s", "top"), ("figures_cpu_s", "logger"))}
    result = {"what": __doc__.strip().splitlines()[0], "batches": args.batches, "frames_per_batch": 64,
              "cores": os.cpu_count(), "load_average_1m": os.getloadavg()[0], "date": time.strftime("%Y-%m-%d"),
              "frames_per_s": median, "over_plain": {n: round(median[n] / median["plain"], 3) for n in CASES[1:]},
              "cpu_s_median": cpu, "cpu_share_median": {n: round(v, 4) for n, v in share.items()},
              "runs": runs}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
