"""A trainer for the async-mode tests: ``python async_trainer.py SPEC REPORT_DIR BATCHES
[kill-worker|kill-and-recover|hang-and-recover|stop-mid-message|recycle|update-weights]``.

It iterates the run's collector and prints one JSON event per batch (its size, the plan rows that took its
steps, whether every step carries a policy version and an episode id, the episodes they resolve to, the worker
lives they come from); with ``kill-worker`` it SIGKILLs env worker 1 of subcollector 1 after the first batch and
reports the error; ``kill-and-recover`` does too (``hang-and-recover``: SIGSTOPs it; ``stop-mid-message``: SIGUSR1s it,
``stop_mid_message/sitecustomize.py``), then stops once every worker of subcollector 1 delivered steps of its next life
(or after BATCHES); several of these joined by ``+`` (``kill-and-recover+hang-and-recover``) are done in turn, each next
one to worker 1 of subcollector 1's latest life once every worker of subcollector 1 delivered steps of it, and the
script stops once they all delivered steps of the life after the last; ``recycle`` stops once every worker did. With
``update-weights`` it passes its own policy, perturbs and pushes its weights after each batch, and reports for
every step whether the log-probability the server stamped is the one the weights of the step's version give.
"""
from __future__ import annotations

import os
import signal
import sys

import torch
from tensordict import TensorDict

from script_events import emit  # this folder: the script's own path entry


def main() -> None:
    import topo
    from topo.errors import LaunchError
    from topo.runtime.episodes import EpisodeId
    from topo.runtime.rundir import RunDir

    spec, report_dir, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else None
    signals = {"kill-worker": signal.SIGKILL, "kill-and-recover": signal.SIGKILL, "hang-and-recover": signal.SIGSTOP,
               "stop-mid-message": signal.SIGUSR1}
    recovering = ("kill-and-recover", "hang-and-recover", "stop-mid-message")
    modes = mode.split("+") if mode else []
    faults = [signals[m] for m in modes if m in signals]  # in turn, to worker (1, 1)'s lives 0, 1, ...
    recover = bool(modes) and all(m in recovering for m in modes)
    update = mode == "update-weights"
    policy = topo.load(spec).make_policy() if update else None
    weights = {0: TensorDict.from_module(policy).data.clone()} if update else {}  # version -> the weights pushed
    run = topo.collector(spec, report_dir=report_dir, progress=False, policy=policy)
    try:
        with run:
            rows = [(sub["index"], row["index"]) for sub in run.plan["subcollectors"] for row in sub["workers"]]
            seen: set[tuple[int, int, int]] = set()  # (subcollector, worker, life) of the steps so far
            wanted = {(c, w, len(faults)) for c, w in rows if c == 1} if recover else {
                (c, w, 1) for c, w in rows} if mode == "recycle" else None  # the lives to see before stopping
            done = 0  # faults done so far
            for i, batch in enumerate(run.collector):
                ids = batch["topo_episode"].reshape(-1).tolist()
                episodes = run.episodes()
                emit(event="batch", run_dir=run.run_dir, frames=batch.numel(), rows=sorted({rows[e] for e in batch["env_index"].tolist()}),
                     versions=sorted(set(batch["policy_version"].reshape(-1).tolist())),
                     episode_rows=sorted({(episodes.get(e).row["subcollector"], episodes.get(e).row["index"])
                                          for e in set(ids)}),
                     step_rows_match=all(rows[w] == (episodes.get(e).row["subcollector"], episodes.get(e).row["index"])
                                         for w, e in zip(batch["env_index"].tolist(), ids)),
                     lives=sorted(lives := {(*rows[w], EpisodeId.of(e).restart)
                                            for w, e in zip(batch["env_index"].tolist(), ids)}))
                seen |= lives
                if update:
                    emit(event="acted", **acted_with(policy, weights, batch))
                    with torch.no_grad():
                        for p in policy.parameters():
                            p.add_(0.05 * torch.randn_like(p))
                    version = run.update_weights()
                    weights[version] = TensorDict.from_module(policy).data.clone()
                    emit(event="pushed", version=version, policy_version=run.policy_version)
                if done < len(faults) and (i == 0 if done == 0 else {(c, w, done) for c, w in rows if c == 1} <= seen):
                    (pid,) = [m["pid"] for m in RunDir(run.run_dir).read_all("markers")
                              if m["name"] == "started" and (m["worker"]["subcollector"], m["worker"]["index"]) == (1, 1)
                              and m.get("restart", 0) == done]
                    os.kill(pid, faults[done])
                    emit(event="killed", pid=pid, life=done, mode=modes[done])
                    done += 1
                if i + 1 == batches or wanted is not None and wanted <= seen:
                    break
    except LaunchError as exc:
        emit(event="launch-error", message=str(exc), subcollector=exc.subcollector, worker=exc.worker)
    if update:
        emit(event="evaluations", results=run.evaluations if run.plan.get("eval") else [])
    emit(event="after", report=run.report.data)


def acted_with(policy, weights: dict, batch) -> dict:
    """Per version in ``batch``: its steps, and the largest gap between the ``action_log_prob`` the server stamped and
    the one the weights pushed as that version give (a copy of ``policy`` loaded with them)."""
    import copy

    def gap(steps, v: int) -> float:
        acting = copy.deepcopy(policy)
        weights[v].to_module(acting)
        with torch.no_grad():
            return float((acting.log_prob(steps) - steps["action_log_prob"]).abs().max())

    flat, out = batch.reshape(-1), {}
    for v in sorted(set(flat["policy_version"].tolist())):
        steps = flat[flat["policy_version"] == v]
        out[str(v)] = {"steps": len(steps), "log_prob_gap": gap(steps, v), "gap_to_version_0": gap(steps, 0)}
    return {"versions": out}


if __name__ == "__main__":
    main()
