"""Where the inference server's time goes: collection frames/s and one request's round trip, per wiring.

    python benchmarks/server_cost.py                 # toy 2 x 4, TinyVLA: 5 rounds (a few minutes)

Collection (``--case NAME``, a fresh process each, rounds alternating): the training loop of
``side_by_side.timed`` on toy 2 x 4 with TinyVLA, the server's own statistics after it (requests per
forward, queue wait, forward time). Cases: ``subcollector`` (a copy in each subcollector, the reference);
``server/whole`` (topo's wiring before: torchrl's client and server, the whole tensordict sent and
returned); ``server`` (topo now: in_keys sent, out_keys returned); ``server/batched`` (that, the server
waiting up to 5 ms for a request from each subcollector: torchrl's ``min_batch_size``).

Round trip (``--round-trips``, a fresh process): one client asking a TinyVLA server for a toy subcollector's
action, one request at a time: ``local`` is the forward alone; ``server/whole`` and ``server`` as above
(topo's manager-backed transport); ``server/plain_queues``: the keys over torchrl's transport without its
manager (what a request would cost without it; topo keeps the manager, which restarted subcollectors need).
Results: ``benchmarks/results/server_cost.json``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

from side_by_side import alternate, timed

HERE = os.path.dirname(os.path.abspath(__file__))
TINYVLA = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}}
SPEC = {"version": 1, "name": "toy-2x4", "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": 2, "workers_per_subcollector": 4},
        "assignment": {"tasks": "0-3", "instructions": {0: "push left", 1: "push right", 2: "lift", 3: "place"},
                       "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 0}},
        "collector": {"frames_per_batch": 64}, "launch": {"startup_timeout": 600}}
CASES = ("subcollector", "server/whole", "server", "server/batched")


# -- torchrl's wiring, for the cases that compare with it (module level: the spawned processes import them) --

def whole_server(factory, kwargs):
    """The served policy as torchrl serves it: replying with the whole tensordict (topo's hook removed)."""
    from topo.launch.policy import in_server

    policy = in_server(factory, kwargs)
    policy._forward_hooks.clear()
    return policy


def whole_client(client_, in_keys, out_keys):
    """torchrl's client: sending the whole tensordict (topo's hook removed)."""
    from topo.launch.policy import client

    remote = client(client_, in_keys, out_keys)
    remote._forward_pre_hooks.clear()
    return remote


def wire(case: str, n: int) -> None:
    """Set topo's server wiring to ``case``'s in this process (the trainer's, which starts the server)."""
    import torchrl.modules.inference_server as served

    from topo.launch import policy

    if case == "server/whole":
        policy.in_server, policy.client = whole_server, whole_client
    if case == "server/batched":
        served.ProcessInferenceServer = functools.partial(served.ProcessInferenceServer, min_batch_size=n,
                                                          timeout=0.005)


def run_case(case: str, batches: int) -> dict:
    import tempfile

    import yaml

    import topo

    spec = json.loads(json.dumps(SPEC))
    spec["policy"] = {**TINYVLA, "placement": "subcollector" if case == "subcollector" else "server"}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(spec, f)
    plan = topo.load(f.name)
    os.unlink(f.name)
    wire(case, spec["topology"]["subcollectors"])
    policy = plan.make_policy()
    with topo.collector(plan, policy=policy, progress=False) as run:
        next(iter(run.collector))  # the first batch: workers warm
        result = timed(run, policy, batches)
        server = run.placement.server
        stats = server.stats() if server is not None else None
    if stats is not None:
        stats = {k: round(stats[k], 2) for k in ("requests", "batches", "avg_batch_size", "p50_queue_ms",
                                                  "p95_queue_ms", "p50_forward_ms", "p95_forward_ms")}
    return {"case": case, **result, "server": stats}


def round_trips(calls: int) -> dict[str, float]:
    """Milliseconds per request, one client and one request at a time; ``local``: the forward alone."""
    import multiprocessing

    import torch
    from tensordict import NonTensorStack, TensorDict
    from torchrl.modules.inference_server import MPTransport, ProcessInferenceServer

    from topo.launch import policy as placement

    request = TensorDict({  # a toy subcollector's carrier: 4 workers
        "observation": {"image": torch.zeros(4, 3, 16, 16, dtype=torch.uint8), "state": torch.zeros(4, 8)},
        "language_instruction": NonTensorStack("push left", "push right", "lift", "place"),
        "collector": {"traj_ids": torch.zeros(4, dtype=torch.long)}, "topo_episode": torch.zeros(4, dtype=torch.long),
        **{k: torch.zeros(4, 1, dtype=dtype) for k, dtype in (("done", torch.bool), ("terminated", torch.bool),
                                                              ("success", torch.bool), ("group_id", torch.long))},
    }, batch_size=[4])
    local = placement.build(TINYVLA["factory"], TINYVLA["kwargs"])
    ms = {"local": _per_call(lambda: local(request.clone()), calls)}
    ctx = multiprocessing.get_context("spawn")
    for name, manager, keys in (("server/whole", True, False), ("server", True, True),
                                ("server/plain_queues", False, True)):
        transport = MPTransport(ctx=ctx, use_manager=manager)
        client_ = transport.client()
        serve = placement.in_server if keys else whole_server
        server = ProcessInferenceServer(policy_factory=functools.partial(serve, *TINYVLA.values()), transport=transport,
                                        mp_context=ctx)
        server.start()
        try:
            ask = (placement.client if keys else whole_client)(client_, local.in_keys, local.out_keys)
            ms[name] = _per_call(lambda: ask(request), calls)
        finally:
            server.shutdown()
            transport.close()
    return ms


def _per_call(call, calls: int) -> float:
    for _ in range(10):
        call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return round((time.perf_counter() - started) / calls * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--round-trips", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "server_cost.json"))
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case, args.batches)), flush=True)
        return
    if args.round_trips:
        print(json.dumps(round_trips(args.calls)), flush=True)
        return
    load = [os.getloadavg()[0]]
    runs = alternate(__file__, CASES, args.rounds, ["--batches", str(args.batches)])
    load.append(os.getloadavg()[0])
    rt = [json.loads(_subprocess([sys.executable, __file__, "--round-trips", "--calls", str(args.calls)]))
          for _ in range(args.rounds)]
    load.append(os.getloadavg()[0])
    base = statistics.median(x["frames_per_s"] for x in runs["subcollector"])
    summary = {case: {"frames_per_s_median": statistics.median(x["frames_per_s"] for x in xs),
                      "frames_per_s": [x["frames_per_s"] for x in xs],
                      "vs_subcollector": round(statistics.median(x["frames_per_s"] for x in xs) / base, 3),
                      "server": xs[len(xs) // 2]["server"]}
               for case, xs in runs.items()}
    out = {"what": __doc__.split("\n\n")[0], "spec": {**SPEC, "policy": TINYVLA}, "batches": args.batches,
           "rounds": args.rounds, "cores": os.cpu_count(), "load_average_1m": {"min": min(load), "max": max(load)},
           "date": time.strftime("%Y-%m-%d"), "cases": summary,
           "round_trip_ms": {k: statistics.median(r[k] for r in rt) for k in rt[0]}, "round_trip_runs": rt,
           "runs": runs}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for case, s in summary.items():
        print(f"{case:16s} {s['frames_per_s_median']:8.1f} frames/s  x{s['vs_subcollector']:.3f} of subcollector  "
              f"server {s['server']}")
    print("round trip ms:", out["round_trip_ms"])


def _subprocess(argv: list[str]) -> str:
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    main()
