"""A training script that checkpoints and resumes, for the resume test: ``python resume_trainer.py SPEC --report DIR
--checkpoint FILE --batches N [--kill-after K] [--resume]``; one JSON line per event on stdout.

Each batch: a policy-gradient step, ``run.update_weights()`` (``eval.every`` evaluates there), then a checkpoint
holding the weights, the optimizer and ``run.state_dict()`` (written whole, then renamed). ``--kill-after K``
SIGKILLs this process once batch K is checkpointed (a preempted node); ``--resume`` starts from the checkpoint.
"""
from __future__ import annotations

import argparse
import os
import signal

from script_events import emit  # this folder: the script's own path entry


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--report", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--batches", type=int, required=True)
    parser.add_argument("--kill-after", type=int)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    import torch

    import topo
    from topo.runtime.episodes import episode_id
    from topo.seeding import seed_globals, trainer_seed

    plan = topo.load(args.spec)
    seed_globals(trainer_seed(plan.data))
    policy = plan.make_policy()
    optim = torch.optim.Adam(policy.parameters(), lr=1e-2)
    state = None
    if args.resume:
        saved = torch.load(args.checkpoint, weights_only=True)
        policy.load_state_dict(saved["policy"])
        optim.load_state_dict(saved["optim"])
        state = saved["topo"]
    with topo.collector(plan, policy=policy, report_dir=args.report, progress=False, resume=state,
                        max_frames_per_traj=4) as run:  # episodes of 4 steps: one a batch per worker
        emit(event="ready", run_dir=run.run_dir)
        done = run.resumed.batches
        for batch in run.collector:
            flat = batch.reshape(-1)
            loss = -(flat["next", "reward"].reshape(-1) * policy.log_prob(flat)).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            version = run.update_weights()
            done += 1
            tmp = args.checkpoint + ".tmp"
            torch.save({"policy": policy.state_dict(), "optim": optim.state_dict(), "topo": run.state_dict()}, tmp)
            os.replace(tmp, args.checkpoint)
            emit(event="batch", number=done, pushed=version,
                 versions=sorted({int(v) for v in batch["policy_version"].reshape(-1).tolist()}),
                 episodes=sorted({episode_id(int(v)) for v in batch["topo_episode"].reshape(-1).tolist()}),
                 rounds=[r["round"] for r in run.evaluations])
            if done == args.kill_after:
                emit(event="killing", trainer=os.getpid())
                os.kill(os.getpid(), signal.SIGKILL)
            if done == args.batches:
                break
    emit(event="report", summary=run.report.data)


if __name__ == "__main__":
    main()
