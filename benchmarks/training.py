"""The training loop's figures: what a policy costs at startup, a weight update, and collection.

    python benchmarks/training.py                 # toy 2 x 4: every case, 3 rounds (a few minutes)
    python benchmarks/training.py --libero        # also real LIBERO 2 x 2 on the CPU (random vs TinyVLA)

For each case, one run of ``topo.collector`` in a fresh process (``--case JSON``): time to ready and
to the first batch, then ``--batches`` iterations of a training loop (collect, one optimizer step,
``update_weights``), timing each weight update and the collection between them. Cases: random
actions; TinyVLA in each subcollector (``shared_mem`` and ``multiprocess`` schemes) and behind one
inference server; a ~100M-parameter policy (TinyVLA carrying 100M more parameters, 400 MB of weights)
the same three ways. Rounds alternate the cases, so drift hits all alike; each figure is the median of
its rounds (min and max kept). Results: ``benchmarks/results/training.json``.
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
LARGE_PARAMS = 100_000_000

TOY = {"version": 1, "name": "toy-2x4", "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
       "topology": {"subcollectors": 2, "workers_per_subcollector": 4},
       "assignment": {"tasks": "0-3", "instructions": {0: "push left", 1: "push right", 2: "lift", 3: "place"},
                      "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 0}},
       "collector": {"frames_per_batch": 64}, "launch": {"startup_timeout": 600}}
POLICY_KWARGS = {"toy": {"action_dim": 4, "image_size": 16, "state_dim": 8},
                 "libero": {"action_dim": 7, "image_size": 64, "state_dim": 9}}


def cases(libero: bool) -> list[dict]:
    out = [{"env": "toy", "policy": None}]
    for model in ("tinyvla", "large"):
        out += [{"env": "toy", "policy": model, "placement": "subcollector", "weight_sync": "shared_mem"},
                {"env": "toy", "policy": model, "placement": "subcollector", "weight_sync": "multiprocess"},
                {"env": "toy", "policy": model, "placement": "server"}]
    if libero:
        out += [{"env": "libero", "policy": None},
                {"env": "libero", "policy": "tinyvla", "placement": "subcollector", "weight_sync": "shared_mem"}]
    return out


def name(case: dict) -> str:
    if case["policy"] is None:
        return f"{case['env']}/random"
    how = case["placement"] if case["placement"] == "server" else f"subcollector/{case['weight_sync']}"
    return f"{case['env']}/{case['policy']}/{how}"


def run_case(case: dict, batches: int) -> dict:
    """In a fresh process: one run, its figures."""
    import torch

    import topo
    from topo.policies.tinyvla import make

    if case["env"] == "toy":
        import yaml

        spec = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"topo-bench-toy-{os.getpid()}.yaml")
        with open(spec, "w") as f:
            yaml.safe_dump(TOY, f)
    else:
        spec = os.path.join(ROOT, "examples", "libero_cpu.yaml")
    plan = topo.compile_spec(spec)
    policy, factory = None, None
    if case["policy"] is not None:
        kwargs = dict(POLICY_KWARGS[case["env"]])
        factory = "topo.policies.tinyvla:make"
        if case["policy"] == "large":
            factory, kwargs = "bench_policies:large", {**kwargs, "extra_params": LARGE_PARAMS}
        plan["policy"] = {"factory": factory, "kwargs": kwargs, "placement": case["placement"], "device": None,
                          "weight_sync": case.get("weight_sync", "shared_mem")}
        sys.path.insert(0, HERE)
        import bench_policies

        policy = bench_policies.large(**kwargs) if case["policy"] == "large" else make(**kwargs)
    optim = torch.optim.SGD(policy.parameters(), lr=1e-4) if policy is not None else None
    t0 = time.perf_counter()
    with topo.collector(plan, policy=policy, progress=False) as run:
        ready = time.perf_counter() - t0
        frames, collect_s, updates = 0, 0.0, []
        waited = time.perf_counter()
        for i, batch in enumerate(run.collector):
            got = time.perf_counter()
            if i == 0:
                first = got - t0
            else:  # collection time between iterations, the first batch (startup) aside
                frames += batch.numel()
                collect_s += got - waited
            if policy is not None:
                loss = -policy.log_prob(batch.reshape(-1)).mean()
                optim.zero_grad()
                loss.backward()
                optim.step()
                started = time.perf_counter()
                run.update_weights()
                updates.append(time.perf_counter() - started)
            if i + 1 >= batches:
                break
            waited = time.perf_counter()
    report = run.report.data
    return {"case": name(case), "ready_s": ready, "first_batch_s": first, "frames_per_s": frames / collect_s,
            "frames_per_batch": plan["collector"]["frames_per_batch"], "update_s": updates,
            "constructions": report["constructions"]["by_role"], "alive_after": report["processes"]["alive_after"],
            "params": sum(p.numel() for p in policy.parameters()) if policy is not None else 0}


def spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--libero", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "training.json"))
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case), args.batches)), flush=True)
        return
    runs: dict[str, list[dict]] = {}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for case in cases(args.libero):
            done = subprocess.run([sys.executable, __file__, "--case", json.dumps(case), "--batches", str(args.batches)],
                                  capture_output=True, text=True, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
            if done.returncode != 0:
                raise SystemExit(f"{name(case)} failed:\n{done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            runs.setdefault(result["case"], []).append(result)
            print(f"{result['case']:<40} ready {result['ready_s']:6.1f}s  first batch {result['first_batch_s']:6.1f}s  "
                  f"{result['frames_per_s']:8.1f} frames/s  update "
                  f"{statistics.median(result['update_s']) if result['update_s'] else 0:.4f}s", flush=True)
            load.append(os.getloadavg()[0])
    summary = {
        "machine": {"cores": os.cpu_count(), "load_average_1m": {"min": min(load), "max": max(load)}},
        "rounds": args.rounds, "batches": args.batches,
        "cases": {case: {
            "ready_s": spread([r["ready_s"] for r in rs]),
            "first_batch_s": spread([r["first_batch_s"] for r in rs]),
            "frames_per_s": spread([r["frames_per_s"] for r in rs]),
            "update_s": spread([statistics.median(r["update_s"]) for r in rs if r["update_s"]]),
            "params": rs[0]["params"], "frames_per_batch": rs[0]["frames_per_batch"],
            "constructions": rs[0]["constructions"], "alive_after": sorted({p for r in rs for p in r["alive_after"]}),
        } for case, rs in runs.items()},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
