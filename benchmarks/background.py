"""The recipe's loop against the iterating loop, side by side: frames per second into the trainer's hands.

    python benchmarks/background.py                  # toy 2 x 4, TinyVLA: 3 rounds (a few minutes)
    python benchmarks/background.py --storage 100000 # the same with a 100,000-row shared storage

Cases (a fresh process each, rounds alternating: ``side_by_side.alternate``), each ``--iterations`` iterations
of ``--frames`` frames on one topo run of toy 2 x 4 with TinyVLA, a weight push per iteration:

- ``iterating``: ``for batch in run.collector`` (batches of ``--frames``), a push after each;
- ``background``: torchrl's vla_grpo shape: ``run.collector.start()`` fills a shared
  ``TensorDictReplayBuffer(LazyTensorStorage(--storage, shared_init=True))``, whose rows are one worker's
  steps of one rollout (``--frames`` / 8 of them); the trainer waits for ``--frames`` more frames, then pushes
  inside ``with run.collector.pause():``.

Frames per second are counted from the first iteration's start to the last one's end. Results:
``benchmarks/results/background.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from side_by_side import TOY_2X4 as SPEC, alternate

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("iterating", "background")


def case(name: str, frames: int, iterations: int, storage: int) -> dict:
    """One case in this process: its frames, seconds and frames per second."""
    import tempfile

    import torch
    import yaml
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    import topo

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump({**SPEC, "collector": {"frames_per_batch": frames}}, f)
    plan = topo.load(f.name)
    os.unlink(f.name)
    policy = plan.make_policy()
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(storage, shared_init=True), shared=True) \
        if name == "background" else None
    extra = {"replay_buffer": buffer} if buffer is not None else {}
    with topo.collector(plan, policy=policy, progress=False, **extra) as run:
        started, got = time.perf_counter(), 0
        if buffer is None:
            for i, batch in enumerate(run.collector):
                got += batch.numel()
                with torch.no_grad():
                    next(policy.parameters()).add_(1e-4)
                run.update_weights()
                if i + 1 == iterations:
                    break
        else:
            per_row = frames // sum(len(sub["workers"]) for sub in plan.subcollectors)  # one worker's steps
            run.collector.start()
            for _ in range(iterations):
                target = buffer.write_count + frames // per_row
                while buffer.write_count < target:
                    time.sleep(0.005)
                with run.collector.pause():
                    with torch.no_grad():
                        next(policy.parameters()).add_(1e-4)
                    run.update_weights()
            got = buffer.write_count * per_row
        seconds = time.perf_counter() - started
    return {"case": name, "frames": got, "seconds": round(seconds, 3), "frames_per_s": round(got / seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--storage", type=int, default=10_000)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "background.json"))
    args = parser.parse_args()
    sizes = ["--frames", str(args.frames), "--iterations", str(args.iterations), "--storage", str(args.storage)]
    if args.case:
        print(json.dumps(case(args.case, args.frames, args.iterations, args.storage)))
        return
    runs = alternate(os.path.abspath(__file__), CASES, args.rounds, sizes)
    median = {name: statistics.median(r["frames_per_s"] for r in results) for name, results in runs.items()}
    result = {"what": __doc__.strip().splitlines()[0], "frames": args.frames, "iterations": args.iterations,
              "storage": args.storage, "cores": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
              "date": time.strftime("%Y-%m-%d"), "frames_per_s": median,
              "background_over_iterating": round(median["background"] / median["iterating"], 3), "runs": runs}
    out = args.out if args.storage == 10_000 else args.out.replace(".json", f"_storage{args.storage}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    sys.exit(0)


if __name__ == "__main__":
    main()
