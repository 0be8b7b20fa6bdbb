"""Does the training example learn? Its evaluations over several seeds, one run at a time.

    python benchmarks/learning.py                     # examples/toy_eval.yaml, seeds 100-104 (the spec's is 100)
    python benchmarks/learning.py --seeds 0-9 --iterations 120 --lr 3e-3

Each seed is one run of ``examples/train_grpo.py SPEC --iterations N --lr LR --seed S`` in a fresh process
(the spec's ``assignment.seeds.base`` set to S: other batches, the same initial weights and the same
held-out eval episodes when the spec fixes ``eval.seeds``), run one after the other. From each run's printed
evaluations: the success rate before training and after the last update. Across seeds: the mean of each
with a 95 % Student t interval, and the rates per seed; also each run's digest (``run digest``), so a rerun
of a seed is checked to be the same run. Results: ``benchmarks/results/learning.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EVALUATION = re.compile(r"^evaluation \d+ \(step (\d+)\): (\d+)/(\d+) episodes succeeded", re.M)
DIGEST = re.compile(r"^run digest: ([0-9a-f]{64})", re.M)


def seeds_of(text: str) -> list[int]:
    """``"0-4"`` or ``"0,3,7"`` to the seeds."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += list(range(int(first), int(last or first) + 1))
    return out


def one_run(spec: str, seed: int, iterations: int, lr: float) -> dict:
    """One training run: its evaluations (step, successes, episodes), digest and wall time."""
    command = [sys.executable, os.path.join(ROOT, "examples", "train_grpo.py"), spec, "--iterations", str(iterations),
               "--lr", str(lr), "--seed", str(seed)]
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    evaluations = [{"step": int(s), "successes": int(k), "episodes": int(n), "rate": int(k) / int(n)}
                   for s, k, n in EVALUATION.findall(done.stdout)]
    digest = DIGEST.search(done.stdout)
    return {"seed": seed, "evaluations": evaluations, "digest": digest.group(1) if digest else None,
            "wall_s": round(time.monotonic() - started, 1)}


def interval(values: list[float]) -> dict:
    """Mean and a 95 % Student t interval of ``values`` (the spread of the runs, not of one run's episodes)."""
    from scipy import stats

    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "ci95": None, "n": len(values)}
    half = float(stats.t.ppf(0.975, len(values) - 1)) * statistics.stdev(values) / len(values) ** 0.5
    return {"mean": round(mean, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)], "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default="examples/toy_eval.yaml")
    parser.add_argument("--seeds", default="100-104")
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "learning.json"))
    args = parser.parse_args()

    runs: list[dict] = []
    for seed in seeds_of(args.seeds):
        runs.append(one_run(args.spec, seed, args.iterations, args.lr))
        first, last = runs[-1]["evaluations"][0], runs[-1]["evaluations"][-1]
        print(f"seed {seed}: {first['rate']:.0%} at step {first['step']} -> {last['rate']:.0%} at step {last['step']} "
              f"({runs[-1]['wall_s']}s, digest {runs[-1]['digest'][:12]})", flush=True)
        result = summary(args, runs)  # written after every seed: an interrupted measurement keeps its runs
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    start, final = result["start"], result["final"]
    print(f"start {start['mean']:.1%} {start['ci95']}, final {final['mean']:.1%} {final['ci95']} over {len(runs)} seeds: "
          f"{'learns' if result['learned'] else 'does not learn reliably'}; {args.out}")


def summary(args: argparse.Namespace, runs: list[dict]) -> dict:
    """The runs so far, and across them the mean and 95 % interval of the first and the last success rate."""
    start = interval([r["evaluations"][0]["rate"] for r in runs])
    final = interval([r["evaluations"][-1]["rate"] for r in runs])
    return {"command": " ".join(["python", "benchmarks/learning.py", *sys.argv[1:]]),
            "spec": args.spec, "iterations": args.iterations, "lr": args.lr, "seeds_asked": seeds_of(args.seeds),
            "episodes_per_evaluation": runs[0]["evaluations"][0]["episodes"], "start": start, "final": final,
            "learned": final["ci95"] is not None and final["ci95"][0] > start["mean"], "runs": runs}

if __name__ == "__main__":
    main()
