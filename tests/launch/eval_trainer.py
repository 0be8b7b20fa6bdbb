"""A training script with evaluation, for the eval tests: ``python eval_trainer.py SPEC --report DIR [--then ...]``.

It steps topo's TinyVLA's weights (a weight-decay step per batch) and pushes them each iteration, so
the spec's ``eval.every`` evaluates after every N-th update; then it asks for one blocking round, then
two background ones at once (the second meets ``busy_policy``) and trains until they end. One JSON line
per event on stdout. ``--then`` misbehaves the way a test needs.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from script_events import emit  # this folder: the script's own path entry

#: a worker killed after a round, then its successor killed during the next round (restarts on)
BETWEEN_THEN_DURING = "kill-eval-worker-between-then-during-rounds"


def eval_runs(run) -> list[str]:
    """The eval run's directory, once the eval process made it (a list: empty before)."""
    root = os.path.join(run.run_dir, "eval", "collector")
    return [os.path.join(root, n) for n in os.listdir(root) if n.startswith("topo-run-")] if os.path.isdir(root) else []


def eval_worker_pid(run, index: int, besides: tuple[int, ...] = ()) -> int:
    """The pid of eval worker ``index`` of eval subcollector 0 (from the eval run's markers), once one not in
    ``besides`` (those killed already) was built."""
    from topo.runtime.rundir import RunDir

    while True:
        for directory in eval_runs(run):
            for m in RunDir(directory).read_all("markers"):
                if m["name"] == "constructed" and m["worker"].get("index") == index and m["pid"] not in besides:
                    return m["pid"]
        time.sleep(0.2)


def judged(run) -> dict:
    """Wait until the eval run has judged a death: its restart decided (an event in its run directory), or the eval
    process ended (restarts off)."""
    from topo.runtime import events
    from topo.runtime.rundir import RunDir

    while True:
        restarts = [e for d in eval_runs(run) for e in events.read(RunDir(d)) if e["name"] == "restart"]
        if restarts:
            return {"restart": restarts[0]}
        if run.eval.proc.poll() is not None:
            return {"code": run.eval.proc.returncode}
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--report", required=True)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--then", default="ok", choices=["ok", "kill-trainer-during-eval", "kill-eval-worker",
                                                         "kill-eval-worker-between-rounds", BETWEEN_THEN_DURING])
    args = parser.parse_args()

    import torch

    import topo

    plan = topo.load(args.spec)
    policy = plan.make_policy()
    optim = torch.optim.SGD(policy.parameters(), lr=1e-3)
    with topo.collector(plan, policy=policy, report_dir=args.report, progress=False) as run:
        emit(event="ready", run_dir=run.run_dir)
        batches = iter(run.collector)
        for i in range(args.iterations):
            next(batches)
            loss = sum((p ** 2).sum() for p in policy.parameters())  # any step: the weights change each iteration
            optim.zero_grad()
            loss.backward()
            optim.step()
            version = run.update_weights()  # eval.every evaluates here, blocking
            emit(event="update", version=version, evaluations=len(run.evaluations))
        killed: tuple[int, ...] = ()
        # after a round; the next asked once the eval run judged it
        if args.then in ("kill-eval-worker-between-rounds", BETWEEN_THEN_DURING):
            emit(event="evaluated", result=run.evaluate(step=50))
            killed = (eval_worker_pid(run, 1),)
            emit(event="killed", pid=killed[0])
            os.kill(killed[0], signal.SIGKILL)
            emit(event="judged", **judged(run))
        # during the next round: its restart reruns the worker's episodes
        if args.then in ("kill-eval-worker", BETWEEN_THEN_DURING):
            threading.Thread(target=lambda: kill_soon(run, killed), daemon=True).start()
        result = run.evaluate(step=100)
        emit(event="evaluated", result=result)
        if not args.then.startswith("kill-eval-worker"):
            accepted = [run.evaluate(wait=False, step=200), run.evaluate(wait=False, step=201)]
            if args.then == "kill-trainer-during-eval":
                emit(event="killing", trainer=os.getpid())
                os.kill(os.getpid(), signal.SIGKILL)
            during = 0
            while run.eval.pending:
                next(batches)
                during += 1
            emit(event="async", accepted=accepted, batches_during=during, rounds=len(run.evaluations))
    emit(event="report", summary=run.report.data, evaluations=[
        {k: r[k] for k in ("round", "step", "policy_version", "acting_version", "episodes", "planned")}
        for r in run.evaluations])


def kill_soon(run, killed: tuple[int, ...] = ()) -> None:
    """SIGKILL eval worker 1 during the round: once it has stepped in it (its heartbeat), at a random instant of
    the next half second; not a fixed time after it was built, which a slow machine reaches before the round.
    ``killed``: the workers killed before, each a restart of the eval subcollector: this kills their successor."""
    import random

    from topo.runtime import heartbeat

    pid = eval_worker_pid(run, 1, killed)
    while True:
        runs = eval_runs(run)
        health = heartbeat.health(runs[0], 0, len(killed)) if runs else None
        if health and len(health) > 1 and health[1] is not None and health[1].steps > 0:
            break
        time.sleep(0.02)
    time.sleep(random.uniform(0.0, 0.5))
    emit(event="killed", pid=pid)
    os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    from topo.errors import LaunchError

    try:
        main()
    except LaunchError as err:
        emit(event="failed", formatted=err.format())
        sys.exit(err.exit_code)
