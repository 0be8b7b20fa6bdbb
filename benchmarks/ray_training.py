"""Training over Ray beside training on one machine: time to ready and seconds per weight update.

    python benchmarks/ray_training.py             # toy 2 x 2, TinyVLA and a ~100M-parameter policy, local vs ray
    python benchmarks/ray_training.py --server    # toy 2 x 2, TinyVLA: copies vs the inference server, local vs ray

Starts a two-node Ray cluster on this host (a head holding ``node_a``, a second node holding ``node_b``; the
helpers of ``tests/ray``), then, alternating the engines, one ``topo.collector`` run per case in a fresh
process: ``--batches`` iterations of collect, one optimizer step, ``update_weights``. The ray case places
subcollector 0 on node_a and 1 on node_b, records per node (``placement.run_dir: per_node``). Policies:
TinyVLA, and ``large`` (benchmarks/training.py's: TinyVLA carrying 100M more parameters, 400 MB of weights).
``--server``: TinyVLA placed in each subcollector or behind one inference server (under Ray, an actor on node_b
beside subcollector 1), on each engine; frames/s over the batches after the first.
Each figure is the median of its rounds (min and max kept). Results: ``benchmarks/results/ray_training.json``,
``--server``: ``benchmarks/results/ray_server_cost.json``.
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
KWARGS = {"action_dim": 4, "image_size": 16, "state_dim": 8}
POLICIES = ("tinyvla", "large")


def spec(engine: str, address: str, placement: str = "subcollector") -> dict:
    out = {"version": 1, "name": f"toy-2x2-{engine}",
           "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
           "topology": {"subcollectors": 2, "workers_per_subcollector": 2, "start_method": {"workers": "spawn"}},
           "assignment": {"tasks": [0, 1], "instructions": {0: "push left", 1: "push right"},
                          "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 0}},
           "collector": {"frames_per_batch": 32}, "launch": {"startup_timeout": 300}}
    if engine == "ray":
        out["placement"] = {"engine": "ray", "address": address, "resources": {"cpus": 1},
                            "overrides": [{"subcollectors": 0, "resources": {"custom": {"node_a": 1}}},
                                          {"subcollectors": 1, "resources": {"custom": {"node_b": 1}}}]}
    if placement == "server":
        out["policy"] = {"factory": "topo.policies.tinyvla:make", "placement": "server"}
        if engine == "ray":  # node_b holds 1: subcollector 1 and the server's actor share it
            out["placement"]["overrides"][1]["resources"]["custom"] = {"node_b": 0.9}
            out["placement"]["server"] = {"cpus": 1, "custom": {"node_b": 0.1}}
    return out


def run_case(engine: str, address: str, model: str, batches: int, placement: str = "subcollector") -> dict:
    """In a fresh process: one run, its figures."""
    import torch
    import yaml

    import bench_policies
    import topo
    from topo.policies.tinyvla import make
    from training import LARGE_PARAMS

    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"topo-bench-ray-{os.getpid()}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(spec(engine, address, placement), f)
    plan = topo.compile_spec(path)
    factory, kwargs = ("topo.policies.tinyvla:make", dict(KWARGS)) if model == "tinyvla" else \
        ("bench_policies:large", {**KWARGS, "extra_params": LARGE_PARAMS})
    plan["policy"] = {"factory": factory, "kwargs": kwargs, "placement": placement, "device": None,
                      "weight_sync": "shared_mem"}
    policy = make(**kwargs) if model == "tinyvla" else bench_policies.large(**kwargs)
    optim = torch.optim.SGD(policy.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    with topo.collector(plan, policy=policy, progress=False) as run:
        ready = time.perf_counter() - t0
        updates, versions, frames = [], [], 0
        for i, batch in enumerate(run.collector):
            if i == 0:
                first = time.perf_counter() - t0
                after_first = time.perf_counter()
            else:
                frames += batch.numel()
            versions.append(sorted({int(v) for v in batch["policy_version"].flatten().tolist()}))
            loss = -policy.log_prob(batch.reshape(-1)).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            started = time.perf_counter()
            run.update_weights()
            updates.append(time.perf_counter() - started)
            if i + 1 >= batches:
                break
        frames_per_s = frames / (time.perf_counter() - after_first)
        # the server's own figures: requests per forward, the wait in its queue, the forward
        served = run.placement.server.stats() if placement == "server" else None
    report = run.report.data
    return {"engine": engine, "policy": model, "placement": placement, "frames_per_s": frames_per_s, "server": served,
            "params": sum(p.numel() for p in policy.parameters()),
            "ready_s": ready, "first_batch_s": first, "update_s": updates,
            "versions_ok": versions == [[i] for i in range(len(versions))],
            "constructions": report["constructions"]["by_role"], "env_closes": report["env_closes"],
            "shutdown_s": report["timings_s"]["shutdown"], "alive_after": report["processes"]["alive_after"]}


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--server", action="store_true", help="copies vs the inference server, local vs ray (TinyVLA)")
    parser.add_argument("--out")
    parser.add_argument("--case", nargs=4, metavar=("ENGINE", "ADDRESS", "POLICY", "PLACEMENT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        sys.path.insert(0, HERE)
        engine, address, model, placement = args.case
        print(json.dumps(run_case(engine, address, model, args.batches, placement)), flush=True)
        return
    out = args.out or os.path.join(HERE, "results", "ray_server_cost.json" if args.server else "ray_training.json")
    cases = [(e, "tinyvla", p) for p in ("subcollector", "server") for e in ("local", "ray")] if args.server else \
        [(e, m, "subcollector") for m in POLICIES for e in ("local", "ray")]
    # the policies' module (bench_policies) importable by the runs, their subcollectors and the Ray workers
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, ROOT])
    sys.path.insert(0, ROOT)
    from tests.ray.ray_head_helpers import ENV, RayHead, RayNode

    started = time.perf_counter()
    head = RayHead(cpus=2, resources={"node_a": 1})
    node = None
    runs: dict[str, list[dict]] = {}
    try:
        node = RayNode(head, {"node_b": 1}, cpus=2)
        cluster_s = time.perf_counter() - started
        for _ in range(args.rounds):
            for engine, model, placement in cases:
                done = subprocess.run([sys.executable, __file__, "--case", engine, head.address, model, placement,
                                       "--batches", str(args.batches)], capture_output=True, text=True, env=ENV)
                if done.returncode != 0:
                    raise SystemExit(f"{engine} {model} {placement} failed:\n{done.stderr[-3000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                name = f"{engine}/{model}" + ("/server" if placement == "server" else "/copies" if args.server else "")
                runs.setdefault(name, []).append(result)
                print(f"{name:<22} ready {result['ready_s']:6.1f}s  first batch {result['first_batch_s']:6.1f}s  "
                      f"{result['frames_per_s']:6.0f} frames/s  update {statistics.median(result['update_s']):.4f}s  "
                      f"shutdown {result['shutdown_s']:.1f}s", flush=True)
    finally:
        if node is not None:
            node.stop()
        head.stop()
    summary = {
        "machine": {"cores": os.cpu_count()}, "rounds": args.rounds, "batches": args.batches,
        "topology": "toy 2 x 2, " + ("TinyVLA in each subcollector (copies) or behind one inference server (under ray: an "
                                     "actor on node_b)" if args.server else "the policy in each subcollector")
                    + "; ray: 2 nodes on this host, one subcollector each",
        "cluster_start_s": round(cluster_s, 1),
        "cases": {case: {
            "params": rs[0]["params"],
            "ready_s": spread([r["ready_s"] for r in rs]),
            "frames_per_s": spread([r["frames_per_s"] for r in rs]),
            **({"server": {key: spread([r["server"][key] for r in rs]) for key in
                           ("avg_batch_size", "p50_queue_ms", "p50_forward_ms", "requests_per_s")}} if rs[0]["server"] else {}),
            "first_batch_s": spread([r["first_batch_s"] for r in rs]),
            "update_s": spread([statistics.median(r["update_s"]) for r in rs]),
            "shutdown_s": spread([r["shutdown_s"] for r in rs]),
            "versions_ok": all(r["versions_ok"] for r in rs),
            "constructions": rs[0]["constructions"], "env_closes": [r["env_closes"] for r in rs],
            "alive_after": sorted({p for r in rs for p in r["alive_after"]}),
        } for case, rs in runs.items()},
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
