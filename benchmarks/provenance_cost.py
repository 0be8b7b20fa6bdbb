"""What episode provenance and action recording cost collection: frames/s with each off and on.

    python benchmarks/provenance_cost.py                  # toy 2 x 2: a step costs ~nothing, the worst case
    python benchmarks/provenance_cost.py --env libero     # real LIBERO 1 x 2 (64 px, CPU)

Each case is one training run in a fresh process (``--case NAME``), the same loop: collect, one optimizer
step, ``update_weights``, for ``--batches`` batches once the collector is ready, episodes of at most
``--episode-steps`` steps (each reset records a seed state). Cases: ``off`` (``launch.provenance: false``),
``episodes`` (the default: ids and episode records), ``actions`` (``launch.record_actions: true``). Rounds
alternate the cases, so drift hits all alike; each figure is the median of its rounds.
Results: ``benchmarks/results/provenance_cost_<env>.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from side_by_side import alternate, timed

HERE = os.path.dirname(os.path.abspath(__file__))
TINYVLA = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}
SPECS = {
    "toy": {"version": 1, "name": "toy-2x2", "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
            "topology": {"subcollectors": 2, "workers_per_subcollector": 2},
            "assignment": {"tasks": "0-3", "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 0}},
            "collector": {"frames_per_batch": 64}, "launch": {"startup_timeout": 600}, "policy": TINYVLA},
    "libero": {"version": 1, "name": "libero-1x2", "env": {"backend": "libero", "kwargs": {
                   "task_suite": "libero_spatial", "camera_height": 64, "camera_width": 64,
                   "env_kwargs": {"hard_reset": False, "camera_names": ["agentview"]}}},
               "topology": {"subcollectors": 1, "workers_per_subcollector": 2},
               "assignment": {"tasks": "0-1", "init_states": {"mode": "cycle", "id": 0}, "seeds": {"base": 0}},
               "collector": {"frames_per_batch": 4}, "launch": {"startup_timeout": 600},
               "policy": {"factory": "topo.policies.tinyvla:make",
                          "kwargs": {"action_dim": 7, "image_size": 64, "state_dim": 9}}},
}
CASES = ("off", "episodes", "actions")


def run_case(env: str, case: str, batches: int, episode_steps: int) -> dict:
    import yaml

    import topo

    spec = json.loads(json.dumps(SPECS[env]))
    spec["launch"].update({"off": {"provenance": False}, "episodes": {}, "actions": {"record_actions": True}}[case])
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(spec, f)
    plan = topo.load(f.name)
    os.unlink(f.name)
    policy = plan.make_policy()
    with tempfile.TemporaryDirectory() as report:
        with topo.collector(plan, policy=policy, progress=False, report_dir=report,
                            max_frames_per_traj=episode_steps) as run:
            next(iter(run.collector))  # the first batch: workers warm
            result = timed(run, policy, batches)
        recorded = run.report["episodes"]
        size = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(recorded["folder"]) for n in names) \
            if os.path.isdir(recorded["folder"]) else 0
    return {"case": case, **result, "episodes": recorded["recorded"], "bytes_recorded": size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", choices=sorted(SPECS), default="toy")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=None, help="default: toy 100, libero 25")
    parser.add_argument("--episode-steps", type=int, default=None, help="default: toy 16, libero 8")
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    batches = args.batches or {"toy": 100, "libero": 25}[args.env]
    steps = args.episode_steps or {"toy": 16, "libero": 8}[args.env]
    if args.case:
        print(json.dumps(run_case(args.env, args.case, batches, steps)), flush=True)
        return
    runs = alternate(__file__, CASES, args.rounds, ["--env", args.env, "--batches", str(batches),
                                                    "--episode-steps", str(steps)])
    base = statistics.median(x["frames_per_s"] for x in runs["off"])
    summary = {case: {"frames_per_s_median": statistics.median(x["frames_per_s"] for x in xs),
                      "frames_per_s": [x["frames_per_s"] for x in xs],
                      "vs_off": round(statistics.median(x["frames_per_s"] for x in xs) / base, 3),
                      "episodes": [x["episodes"] for x in xs],
                      "bytes_per_episode": round(statistics.median(x["bytes_recorded"] / max(1, x["episodes"]) for x in xs))}
               for case, xs in runs.items()}
    out = {"what": __doc__.split("\n\n")[0], "env": args.env, "spec": SPECS[args.env], "batches": batches,
           "episode_steps": steps, "rounds": args.rounds, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
           "cases": summary, "runs": runs}
    path = args.out or os.path.join(HERE, "results", f"provenance_cost_{args.env}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    for case, s in summary.items():
        print(f"{case:8s} {s['frames_per_s_median']:8.1f} frames/s  x{s['vs_off']:.3f} of off  "
              f"{s['bytes_per_episode']} bytes/episode")


if __name__ == "__main__":
    main()
