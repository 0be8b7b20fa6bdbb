"""Where the inference server's time goes: collection frames/s and one request's round trip, per wiring.

    python benchmarks/server_cost.py                 # toy 2 x 4, TinyVLA: 3 rounds (a few minutes)

Collection (``--case NAME``, a fresh process each, rounds alternating): the training loop of
``side_by_side.timed`` on toy 2 x 4 with TinyVLA, the server's own statistics after it (requests per
forward, queue wait, forward time). Cases: ``subcollector`` (a copy in each subcollector, the reference);
``server/manager`` (the server over torchrl's manager-backed ``MPTransport``, the policy's in_keys sent and
its out_keys returned: topo's transport before, and still where no slot layout is known); ``server`` (topo
now: torchrl's ``ProcessSlotTransport``, one shared-memory slot per subcollector: ``topo.launch.server_slots``).

Round trip (``--round-trips``, a fresh process): one client asking a TinyVLA server, one request at a time,
client and server on one torch thread each,
at two sizes (4 envs x 16 px, a toy subcollector; 16 envs x 128 px): ``local`` is the forward alone;
``server/manager`` and ``server`` as above; ``overhead_ms`` is a transport's round trip less ``local``.
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
CASES = ("subcollector", "server/manager", "server")
SIZES = {"4x16px": (4, 16), "16x128px": (16, 128)}  # round trips: envs per request, image side


def wire(case: str) -> None:
    """Set topo's server wiring to ``case``'s in this process (the trainer's, which starts the server)."""
    from topo.launch import server_slots

    if case == "server/manager":
        server_slots.layout = lambda plan: (None, "benchmarks/server_cost.py: the manager-backed transport")


def one_thread(factory):
    """The served policy, its process on one torch thread as the client's (two threads on this loaded machine's
    two cores time contention, not the forward)."""
    import torch

    torch.set_num_threads(1)
    return factory()


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
    wire(case)
    policy = plan.make_policy()
    with topo.collector(plan, policy=policy, progress=False) as run:
        next(iter(run.collector))  # the first batch: workers warm
        result = timed(run, policy, batches)
        server = run.placement.server
        stats = server.stats() if server is not None else None
        transport = run.placement.describe().get("transport")
    if stats is not None:
        stats = {k: round(stats[k], 2) for k in ("requests", "batches", "avg_batch_size", "p50_queue_ms",
                                                  "p95_queue_ms", "p50_forward_ms", "p95_forward_ms")}
    return {"case": case, **result, "transport": transport, "server": stats}


def round_trips(calls: int) -> dict[str, dict[str, float]]:
    """Per size, milliseconds per request, one client and one request at a time; ``local``: the forward alone."""
    import multiprocessing

    import torch
    from tensordict import NonTensorStack, TensorDict
    from torchrl.modules.inference_server import MPTransport, ProcessInferenceServer, ProcessSlotTransport

    from topo.launch import policy as placement
    from topo.launch import server_slots

    torch.set_num_threads(1)
    ctx = multiprocessing.get_context("spawn")
    out = {}
    for size, (n, px) in SIZES.items():
        kwargs = {**TINYVLA["kwargs"], "image_size": px}
        request = TensorDict({  # a subcollector's carrier
            "observation": {"image": torch.randint(0, 255, (n, 3, px, px), dtype=torch.uint8), "state": torch.zeros(n, 8)},
            "language_instruction": NonTensorStack(*(["push left", "push right", "lift", "place"] * n)[:n]),
            "collector": {"traj_ids": torch.zeros(n, dtype=torch.long)}, "topo_episode": torch.zeros(n, dtype=torch.long),
            **{k: torch.zeros(n, 1, dtype=dtype) for k, dtype in (("done", torch.bool), ("terminated", torch.bool),
                                                                  ("success", torch.bool), ("group_id", torch.long))},
        }, batch_size=[n])
        lay = server_slots.Layout(n, {("observation", "image"): ((3, px, px), "uint8"),
                                      ("observation", "state"): ((8,), "float32"),
                                      ("language_instruction",): ((), "str")}, server_slots.TEXT_BYTES)
        local = placement.build(TINYVLA["factory"], kwargs)
        packing = placement._packing(local, lay, None)
        ms = {"local": _per_call(lambda: local(request.clone()), calls)}
        for name in ("server/manager", "server"):
            slots = lay if name == "server" else None
            transport = ProcessSlotTransport(server_slots.request_spec(lay), server_slots.response_spec(n), num_slots=1,
                                             ctx=ctx, copy_result=False) if slots else MPTransport(ctx=ctx, use_manager=True)
            client_ = transport.client()
            server = ProcessInferenceServer(policy_factory=functools.partial(one_thread, functools.partial(
                placement.in_server, TINYVLA["factory"], kwargs, None, slots)), transport=transport, mp_context=ctx)
            server.start()
            try:
                ask = placement.client(client_, local.in_keys, [*local.out_keys, placement.VERSION_KEY], slots, packing)
                ms[name] = _per_call(lambda: ask(request), calls)
            finally:
                server.shutdown()
                if hasattr(transport, "close"):
                    transport.close()
        out[size] = {**ms, "overhead_ms": {k: round(ms[k] - ms["local"], 2) for k in ("server/manager", "server")}}
    return out


def _per_call(call, calls: int) -> float:
    for _ in range(10):
        call()
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return round((time.perf_counter() - started) / calls * 1000, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
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
           "round_trip_ms": {size: {k: statistics.median(r[size][k] for r in rt) for k in ("local", *CASES[1:])}
                             for size in SIZES},
           "overhead_ms": {size: {k: statistics.median(r[size]["overhead_ms"][k] for r in rt) for k in CASES[1:]}
                           for size in SIZES},
           "round_trip_runs": rt,
           "runs": runs}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for case, s in summary.items():
        print(f"{case:16s} {s['frames_per_s_median']:8.1f} frames/s  x{s['vs_subcollector']:.3f} of subcollector  "
              f"server {s['server']}")
    print("round trip ms:", out["round_trip_ms"])
    print("overhead beyond the forward, ms:", out["overhead_ms"])


def _subprocess(argv: list[str]) -> str:
    import subprocess

    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    main()
