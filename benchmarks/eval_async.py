"""What an evaluation running beside training costs the training collector.

    python benchmarks/eval_async.py                # toy 2 x 2 training, 2 eval workers, 3 rounds

Each case is one training run in a fresh process (``--case NAME``): the same loop (collect, one
optimizer step, ``update_weights``) for ``--batches`` batches once the collector is ready, timing the
collection between updates. Cases: ``none`` (no eval section); ``async`` (an async evaluation asked for
whenever none runs, so one always runs beside training: the worst case). Rounds alternate the cases, so drift hits all alike; each figure is the median of its
rounds. On this 2-core machine the eval process and its workers share the cores with training's, which
is the cost measured. Results: ``benchmarks/results/eval_async.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from side_by_side import alternate, timed

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = {"version": 1, "name": "toy-2x2-eval", "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": 2, "workers_per_subcollector": 2},
        "assignment": {"tasks": "0-3", "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 0}},
        "collector": {"frames_per_batch": 64}, "launch": {"startup_timeout": 600},
        "policy": {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16,
                                                                       "state_dim": 8}},
        "eval": {"tasks": "4-5", "trials": 8, "workers": 2, "max_episode_steps": 32}}
CASES = ("none", "async")


def run_case(case: str, batches: int) -> dict:
    import topo

    spec = json.loads(json.dumps(SPEC))
    if case == "none":
        spec.pop("eval")
    else:
        spec["eval"]["async"] = True
    import tempfile

    import yaml

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(spec, f)
    plan = topo.load(f.name)
    os.unlink(f.name)
    policy = plan.make_policy()
    with topo.collector(plan, policy=policy, progress=False) as run:
        if case != "none":
            run.evaluate()  # the eval process is up before timing starts

        def keep_one_running():
            if case != "none" and not run.eval.pending:
                run.evaluate(wait=False)

        result = timed(run, policy, batches, keep_one_running)
        rounds = len(run.evaluations)
    return {"case": case, **result, "evaluations": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "eval_async.json"))
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.batches)), flush=True)
        return
    runs = alternate(__file__, CASES, args.rounds, ["--batches", str(args.batches)])
    base = statistics.median(x["frames_per_s"] for x in runs["none"])
    summary = {case: {"frames_per_s_median": statistics.median(x["frames_per_s"] for x in xs),
                      "frames_per_s": [x["frames_per_s"] for x in xs],
                      "evaluations": [x["evaluations"] for x in xs],
                      "vs_none": round(statistics.median(x["frames_per_s"] for x in xs) / base, 3)}
               for case, xs in runs.items()}
    out = {"what": __doc__.split("\n\n")[0], "spec": SPEC, "batches": args.batches, "rounds": args.rounds,
           "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "cases": summary, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for case, s in summary.items():
        print(f"{case:6s} {s['frames_per_s_median']:8.1f} frames/s  x{s['vs_none']:.2f} of no eval  "
              f"evaluations {s['evaluations']}")


if __name__ == "__main__":
    main()
