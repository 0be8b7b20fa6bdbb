"""A training script for the API tests: ``python trainer.py SPEC [options]``; one JSON line per event on stdout.

It trains topo's TinyVLA policy with a policy-gradient step per batch and pushes its weights each
iteration, checking every batch against the weights it pushed: each row's ``policy_version`` and, with
deterministic actions, the action the trainer's own copy computes for the same observation.
``--then`` makes it misbehave the way a test needs (``--raise-at``: the loop raises after that batch, too);
``--evaluate`` (a spec with an eval section) then asks for one blocking evaluation round and two background ones at
once (the second meets ``busy_policy``) and waits for them.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time

from script_events import emit  # this folder: the script's own path entry


def process_state() -> dict:
    import torch

    return {"start_method": multiprocessing.get_start_method(allow_none=True), "threads": torch.get_num_threads(),
            "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
            "topo_env": sorted(k for k in os.environ if k.startswith("TOPO_")), "mujoco_gl": os.environ.get("MUJOCO_GL")}


def worker_pid(run, subcollector: int, index: int, wait: float = 10.0) -> int:
    """The pid of env worker ``index`` of ``subcollector``, in its subcollector's latest start (under Ray, per-node
    records reach the trainer within seconds: waits for them up to ``wait``)."""
    from topo.runtime.rundir import RunDir

    restart = run.state.subcollectors[subcollector].restart
    deadline = time.monotonic() + wait
    while True:
        pids = [m["pid"] for m in RunDir(run.run_dir).read_all("markers") if m["name"] == "started"
                and m["worker"] == {**m["worker"], "subcollector": subcollector, "index": index}
                and m.get("restart", 0) == restart]
        if pids or time.monotonic() > deadline:
            (pid,) = pids
            return pid
        time.sleep(0.2)


def rows_seen(batch) -> list[list[dict]]:
    """Per subcollector, per worker of a sync batch ``[C, M, T]``: the instructions and group blocks seen."""
    def flat(value):
        value = value.tolist() if hasattr(value, "tolist") else value
        return [value] if isinstance(value, str) else [x for item in value for x in flat(item)]

    return [[{"instructions": sorted(set(flat(batch[c, w]["language_instruction"]))),
              "groups": sorted({int(g) // 10**6 for g in batch[c, w]["group_id"].flatten().tolist()})}
             for w in range(batch.shape[1])] for c in range(batch.shape[0])]


class TrainingStepFailed(ValueError):
    """What ``--then raise`` raises in the loop."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--placement", choices=["subcollector", "server"], default="subcollector")
    parser.add_argument("--weight-sync", default="shared_mem")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--report")
    parser.add_argument("--restarts", type=int, default=0, help="launch.restarts max")
    parser.add_argument("--hang-timeout", type=float, default=None, help="launch.hang_timeout")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="SIGSTOP env worker 0 of subcollector 1 after this iteration (a hang)")
    parser.add_argument("--record-actions", action="store_true", help="launch.record_actions: true")
    parser.add_argument("--hold", default=None, help="after the first batch, wait until this file exists")
    parser.add_argument("--max-frames-per-traj", type=int, default=None, help="the collector's episode length bound")
    parser.add_argument("--torchrl-without-restarts", action="store_true",
                        help="run as on a torchrl that lacks the names restarts need (topo.launch.boundary)")
    parser.add_argument("--evaluate", action="store_true",
                        help="after the loop: a blocking evaluation round, then two background ones; waits for them")
    parser.add_argument("--victim", type=int, default=0, help="the subcollector kill-subcollector-then-update kills")
    parser.add_argument("--raise-at", type=int, default=None,
                        help="raise in the loop after this batch's event, whatever --then does (--then raise: batch 0)")
    parser.add_argument("--then", default="ok",
                        choices=["ok", "raise", "kill-worker", "kill-subcollector-then-update", "skip-first-update",
                                 "kill-server"])
    args = parser.parse_args()

    import torch
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    import topo
    from topo.errors import LaunchError
    from topo.policies.tinyvla import make

    if args.torchrl_without_restarts:
        import dataclasses

        from topo.launch import boundary

        real = boundary.support
        boundary.support = lambda features: dataclasses.replace(
            real(features), missing={"restarts": ["torchrl.collectors._multi_base._make_process_no_warn_cls"]})
    plan = topo.compile_spec(args.spec)
    kwargs = (plan["policy"] or {}).get("kwargs") or {"action_dim": 4, "image_size": 16, "state_dim": 8}
    plan["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": kwargs, "placement": args.placement,
                      "device": None, "weight_sync": args.weight_sync}
    plan["launch"]["restarts"] = {"max": args.restarts, "window": None}
    if args.hang_timeout is not None:
        plan["launch"]["hang_timeout"] = args.hang_timeout
    if args.record_actions:
        plan["launch"]["record_actions"] = True
    extra = {} if args.max_frames_per_traj is None else {"max_frames_per_traj": args.max_frames_per_traj}
    policy = make(**kwargs)
    optim = torch.optim.SGD(policy.parameters(), lr=0.1)
    emit(event="before", state=process_state())
    run = topo.collector(plan, policy=policy, report_dir=args.report, progress=False,
                         exploration_type=ExplorationType.DETERMINISTIC, **extra)
    try:
        with run:
            emit(event="ready", run_dir=run.run_dir, trainer=os.getpid())
            for i, batch in enumerate(run.collector):
                flat = batch.reshape(-1)
                with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
                    expected = policy.mean(flat)
                emit(event="batch", iteration=i, shape=list(batch.shape),
                     versions=sorted({int(v) for v in batch["policy_version"].flatten().tolist()}),
                     diff=float((expected - flat["action"]).abs().max()), rows=rows_seen(batch),
                     restarts=[(r["subcollector"], r["outcome"]) for r in run.restarts], memory=run.worker_memory(),
                     episodes=sorted({(int(e), int(v)) for e, v in zip(flat["topo_episode"].reshape(-1).tolist(),
                                                                       flat["policy_version"].reshape(-1).tolist())}))
                while args.hold and i == 0 and not os.path.exists(args.hold):  # a test looks at the running run
                    time.sleep(0.1)
                if args.then == "raise" or i == args.raise_at:
                    raise TrainingStepFailed("the training step failed")
                if args.then == "kill-worker" and i == 0:
                    victim = worker_pid(run, 1, 1)
                    os.kill(victim, signal.SIGKILL)
                    emit(event="killed", pid=victim)
                if args.then == "kill-server" and i == 0:
                    victim = run.state.server().pid
                    os.kill(victim, signal.SIGKILL)
                    emit(event="killed", pid=victim)
                if i == args.stop_at:
                    victim = worker_pid(run, 1, 0)
                    os.kill(victim, signal.SIGSTOP)
                    emit(event="stopped", pid=victim)
                if args.then == "kill-subcollector-then-update":
                    deadline = time.monotonic() + 10  # Ray, per-node records: known once the monitor read the pull
                    while run.state.subcollectors[args.victim].pid is None and time.monotonic() < deadline:
                        time.sleep(0.1)
                    victim = run.state.subcollectors[args.victim].pid
                    os.kill(victim, signal.SIGKILL)
                    emit(event="killed", pid=victim)
                    time.sleep(0.5)
                loss = policy.mean(flat).pow(2).mean()  # a step that surely changes the weights
                optim.zero_grad()
                loss.backward()
                optim.step()
                if args.then == "skip-first-update" and i == 0:
                    continue  # the copies must go on acting with the weights last pushed
                started = time.monotonic()
                version = run.update_weights()
                emit(event="update", version=version, seconds=time.monotonic() - started)
                if i + 1 >= args.iterations:
                    break
            if args.evaluate:  # as tests/launch/eval_trainer.py, without collecting while the background round runs
                emit(event="evaluated", result=run.evaluate(step=100))
                accepted = [run.evaluate(wait=False, step=200), run.evaluate(wait=False, step=201)]
                run.eval.wait()
                emit(event="async", accepted=accepted, rounds=len(run.evaluations))
            if args.record_actions:
                emit(event="episodes", ids=[str(e.id) for e in run.episodes()])
    except LaunchError as err:
        emit(event="launch-error", message=str(err), subcollector=err.subcollector, worker=err.worker,
             row=err.row, exit_code=err.exit_code, formatted=err.format())
    except TrainingStepFailed as err:  # the loop's own, on purpose; any other exception fails the script
        emit(event="loop-error", message=str(err))
    emit(event="after", state=process_state(), report=run.report.data if run.report else None, restarts=run.restarts,
         evaluations=[{k: r[k] for k in ("round", "step", "policy_version", "acting_version", "episodes", "planned")}
                      for r in run.evaluations])
    print(run.report, file=sys.stderr)


if __name__ == "__main__":
    main()
