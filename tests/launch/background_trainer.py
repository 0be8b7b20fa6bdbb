"""A trainer of the recipe's shape (torchrl's vla_grpo): ``python background_trainer.py SPEC REPORT [options]``.

The collector fills a shared replay buffer in the background (``run.collector.start()``); each iteration waits
until the buffer holds ``--rows`` more rows, then updates inside ``with run.collector.pause():``, pushing the
policy's weights. One JSON line per event on stdout. ``--then kill-worker`` SIGKILLs env worker 1 of
subcollector 1 after iteration ``--at``; ``--then stop-worker`` SIGSTOPs it (a hang); repeated, each next one is done
to the worker of the subcollector's latest start once every restart so far collects. ``--placement server``: the
policy on topo's inference server (the recipe's way), synced in each pause.
"""
from __future__ import annotations

import argparse
import os
import signal
import time

from script_events import emit, rows_arrived  # this folder: the script's own path entry
from trainer import worker_pid

WAIT_S = 240.0  # a buffer that stops filling ends the script, named, long before the test's guard


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("report")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--restarts", type=int, default=0)
    parser.add_argument("--hang-timeout", type=float, default=None)
    parser.add_argument("--then", choices=["kill-worker", "stop-worker"], action="append", default=[],
                        help="repeat for more, in order: each next once every restart so far collects")
    parser.add_argument("--at", type=int, default=1)
    parser.add_argument("--placement", choices=["subcollector", "server"], default="subcollector")
    parser.add_argument("--until-collecting", action="store_true",
                        help="past --iterations, go on until every --then was done and each restart it caused "
                             "collects (at most WAIT_S from the start, and from each later --then)")
    args = parser.parse_args()

    import torch
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    import topo
    from topo.errors import LaunchError
    from topo.launch.instruction_bytes import decode
    from topo.policies.tinyvla import make

    plan = topo.compile_spec(args.spec)
    kwargs = {"action_dim": 4, "image_size": 16, "state_dim": 8}
    plan["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": kwargs, "placement": args.placement,
                      "device": None, "weight_sync": "shared_mem"}
    plan["launch"]["restarts"] = {"max": args.restarts, "window": None}
    if args.hang_timeout is not None:
        plan["launch"]["hang_timeout"] = args.hang_timeout
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000, shared_init=True), shared=True)
    policy = make(**kwargs)
    run = topo.collector(plan, policy=policy, report_dir=args.report, progress=False, replay_buffer=buffer)
    try:
        with run:
            emit(event="ready", run_dir=run.run_dir)
            run.collector.start()
            rollout = run.collector.frames_per_batch_worker(worker_idx=0)  # frames of one subcollector's rollout
            i, deadline, todo, done = 0, time.monotonic() + WAIT_S, list(args.then), 0
            settled = lambda: len(run.restarts) >= done and all(  # noqa: E731
                r["outcome"] == "collecting" for r in run.restarts)  # every restart the faults so far caused
            while i < args.iterations or (args.until_collecting and time.monotonic() < deadline and (
                    todo or not settled())):
                began = rows_arrived(buffer, args.rows, i, WAIT_S)
                if began is None:
                    return
                with run.collector.pause():
                    with torch.no_grad():
                        for p in policy.parameters():
                            p.add_(0.01)
                    version = run.update_weights()
                rows = buffer[: len(buffer)]
                text = decode(rows["topo", "instruction"])  # strings cross a shared buffer as bytes
                emit(event="iteration", iteration=i, seconds=time.monotonic() - began, version=version,
                     rows=len(buffer), versions=sorted({int(v) for v in rows["policy_version"].flatten().tolist()}),
                     instructions=sorted(set(text)), strings="language_instruction" in rows.keys(),
                     restarts=[(r["subcollector"], r["outcome"]) for r in run.restarts])
                if todo and (i == args.at if done == 0 else i > args.at and settled()):
                    how = todo.pop(0)
                    victim = worker_pid(run, 1, 1)
                    os.kill(victim, signal.SIGKILL if how == "kill-worker" else signal.SIGSTOP)
                    emit(event="faulted", pid=victim, how=how)
                    done += 1
                    if done > 1:  # each restart its own WAIT_S to collect, as in a run of one fault
                        deadline = time.monotonic() + WAIT_S
                i += 1
        emit(event="written", frames=int(buffer[: len(buffer)].numel()) if len(buffer) else 0, rollout=rollout)
    except LaunchError as exc:
        emit(event="launch-error", message=str(exc), subcollector=exc.subcollector, worker=exc.worker)
    finally:
        emit(event="after", report=run.report.data if run.report else None)


if __name__ == "__main__":
    main()
