"""Train torchrl's TinyVLA with a group-relative policy gradient on a topo topology.

    python examples/train_grpo.py examples/toy_2x3.yaml                      # seconds, no simulator
    python examples/train_grpo.py examples/libero_cpu.yaml --iterations 3    # real LIBERO, on the CPU
    python examples/train_grpo.py examples/toy_eval.yaml --iterations 80 --lr 1e-2   # evaluated every 20
    python examples/train_grpo.py examples/toy_traced.yaml --episode-steps 8 --report runs/traced   # replayable
    python examples/train_grpo.py examples/toy_eval.yaml --seed 7   # another run: the spec's seeds.base set to 7
    python examples/train_grpo.py examples/toy_eval.yaml --iterations 80 --lr 1e-2 --seed 101 --save trained.pt

The spec's ``policy`` section names the factory (``topo.policies.tinyvla:make``) and where the copies
that act run (each subcollector, or one inference server). This script builds its own copy from the
same factory, iterates the collector topo builds, takes one policy-gradient step per batch with
advantages normalised within each GRPO group id, and pushes its weights to every acting copy each
iteration. Every row of a batch says which weights acted (``policy_version``). A spec with an ``eval``
section is evaluated before training (the baseline) and as it says (``eval.every``); each evaluation's
table is printed as it ends. With ``--report DIR`` the run is kept: the script ends naming its
lowest-return episode, which ``topo runs show`` and ``topo replay`` read from there.

The run reproduces: the trainer seeds its own generators from the plan (``trainer_seed``; topo seeds every
process it starts), so the same spec and seed give the same batches, weights and evaluations, and the same
``run digest`` (a sha256 over every batch, printed last, with one over the weights after every update);
``--seed`` gives another run of the same spec.
"""
from __future__ import annotations

import argparse
import hashlib
import time

import torch

import topo
from topo import eval_table
from topo.seeding import seed_globals, trainer_seed


def group_advantages(reward: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Each reward against the others of its group: (r - mean) / std within the group (0 for a lone row)."""
    advantages = torch.zeros_like(reward)
    for g in group.unique():
        rows = group == g
        r = reward[rows]
        if r.numel() > 1:
            advantages[rows] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    return advantages


def load(spec: str, seed: int | None) -> topo.Plan:
    """The plan of ``spec`` (a spec compiled now, or a saved plan still fresh); with ``seed``, of the spec with
    ``assignment.seeds.base: seed``."""
    if seed is None:
        return topo.load(spec)
    source = topo.load_spec(spec)
    source.data.setdefault("assignment", {}).setdefault("seeds", {})["base"] = seed
    return topo.load(topo.compile_source(source))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="a spec (or saved plan) with a policy section")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--report", help="keep the run in DIR (summary.json, episodes), as `topo launch --report` does")
    parser.add_argument("--episode-steps", type=int, default=None, help="end each episode after this many steps")
    parser.add_argument("--seed", type=int, default=None, help="the spec's assignment.seeds.base (a spec only)")
    parser.add_argument("--save", help="write the trained weights here (a state dict: topo eval --weights reads it)")
    args = parser.parse_args()

    plan = load(args.spec, args.seed)
    seed_globals(trainer_seed(plan.data))  # the trainer's own draws (topo seeds the processes it starts)
    policy = plan.make_policy()  # the trainer's copy, from the factory the acting copies come from
    optim = torch.optim.Adam(policy.parameters(), lr=args.lr)

    shown: list[dict] = []
    weights = hashlib.sha256()  # the trainer's weights after every update, in order
    bound = {} if args.episode_steps is None else {"max_frames_per_traj": args.episode_steps}
    with topo.collector(plan, policy=policy, report_dir=args.report, **bound) as run:
        if plan.data.get("eval"):
            print(eval_table(run.evaluate(step=0)), flush=True)  # the untrained policy: the baseline
            shown.append(run.evaluations[0])
        for i, batch in enumerate(run.collector):
            flat = batch.reshape(-1)
            reward = flat["next", "reward"].reshape(-1)
            group = flat["group_id"].reshape(-1)
            advantages = group_advantages(reward, group)
            loss = -(advantages * policy.log_prob(flat)).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            for value in policy.state_dict().values():
                weights.update(value.numpy().tobytes())
            started = time.perf_counter()
            version = run.update_weights()
            acted = sorted({int(v) for v in batch["policy_version"].flatten().tolist()})
            print(f"iteration {i}: {flat.numel()} steps, mean reward {reward.mean():+.4f}, loss {loss.item():+.4f}, "
                  f"acted with weights v{acted}, pushed v{version} in {time.perf_counter() - started:.3f}s", flush=True)
            for result in run.evaluations[len(shown):]:
                shown.append(result)
                print(eval_table(result), flush=True)
            if i + 1 >= args.iterations:
                break
        ended = [e for e in run.episodes() if e.end is not None and e.end["how"] != "closed"]
    print(run.report)
    if args.save:
        torch.save(policy.state_dict(), args.save)
        print(f"weights saved: {args.save}")
    print(f"run digest: {run.digest.hexdigest} ({run.digest.batches} batches); weights {weights.hexdigest()}")
    if args.report and ended:
        worst = min(ended, key=lambda e: e.end["return"])
        print(f"lowest return: episode {worst.id} ({worst.end['return']:+.3f} over {worst.end['steps']} steps, "
              f"subcollector {worst.row['subcollector']}, worker {worst.row['index']}, task {worst.row['task_id']}); "
              f"see it again: topo replay {args.report} {worst.id}")


if __name__ == "__main__":  # subcollectors import this file again: the loop stays here
    main()
