"""The recipe's loop (torchrl's vla_grpo ``vla-grpo.py``), written here, through topo's drop-in
(:mod:`topo.recipes.vla_grpo`): ``python recipe_trainer.py SPEC REPORT [--iterations N] [--rows N]``.

As the recipe: ``make_collector(cfg, policy, device, tokenizer=, replay_buffer=)``, the server synced before
``collector.start()``, each iteration waits for ``--rows`` more rows, then inside ``with collector.pause():``
updates, drops partial trajectories (``collector.map_fn("reset")``, its ``reset_collection_state``) and syncs;
its ``finally`` shuts down the collector, the server and its transport. The spec has no policy section: the server acts with a copy of the trainer's policy, synced the recipe's way (a TensorDict of the
trainable parameters only). One JSON line per event on stdout.
"""
from __future__ import annotations

import argparse
import time

from script_events import emit, rows_arrived  # this folder: the script's own path entry

WAIT_S = 240.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("report")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--rows", type=int, default=48)
    args = parser.parse_args()

    import torch
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from topo import episode_id
    from topo.launch.instruction_bytes import decode
    from topo.policies.tinyvla import make
    from topo.recipes.vla_grpo import make_collector

    def sync_policy_server(server, policy):  # the recipe's, trainable_only=True: a partial TensorDict
        weights = TensorDict.from_module(policy).apply(lambda t: t if t.requires_grad else None, filter_empty=True)
        return server.update_model_weights(weights.data.detach().clone().cpu())

    def by_episode(rows) -> dict:  # per episode in the buffer: the instructions, group ids and versions its rows carry
        out: dict = {}
        for e, text, group, version in zip(rows["topo_episode"].flatten().tolist(), decode(rows["topo", "instruction"]),
                                           rows["group_id"].flatten().tolist(), rows["policy_version"].flatten().tolist()):
            seen = out.setdefault(episode_id(e), {"instructions": set(), "group_ids": set(), "versions": set(),
                                                  "rows": 0})
            seen["instructions"].add(text), seen["group_ids"].add(int(group)), seen["versions"].add(int(version))
            seen["rows"] += 1
        for e, done in zip(rows["topo_episode"].flatten().tolist(), rows["next", "done"].flatten().tolist()):
            out[episode_id(e)]["last_done"] = bool(done)  # rows in write order: an episode's last row, done
        return {e: {k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()} for e, seen in out.items()}

    policy = make(action_dim=4, image_size=16, state_dim=8)
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(10_000, shared_init=True), shared=True)
    began = time.monotonic()
    collector, policy_server, eval_policy = make_collector(None, policy, torch.device("cpu"), tokenizer=None,
                                                           replay_buffer=buffer, spec=args.spec,
                                                           report_dir=args.report)
    run = collector.run
    emit(event="ready", run_dir=run.run_dir, served=run.plan["policy"], seconds=time.monotonic() - began)
    try:
        first = sync_policy_server(policy_server, policy)
        collector.start()
        for i in range(args.iterations):
            began = rows_arrived(buffer, args.rows, i, WAIT_S)
            if began is None:
                return
            with collector.pause():
                with torch.no_grad():
                    for p in policy.parameters():
                        p.add_(1e-4)  # an update that keeps the toy episodes ending (they are not truncated)
                rows = buffer[: len(buffer)]
                collector.map_fn("reset")  # the recipe's reset_collection_state: partial trajectories dropped
                version = sync_policy_server(policy_server, policy)
            same = all(torch.equal(a, b) for a, b in zip(policy.parameters(), eval_policy.parameters()))
            emit(event="iteration", iteration=i, seconds=time.monotonic() - began, version=version, first=first, rows=len(buffer), eval_synced=same,
                 versions=sorted({int(v) for v in rows["policy_version"].flatten().tolist()}),
                 instructions=sorted(set(decode(rows["topo", "instruction"]))),
                 keys=sorted(str(k) for k in rows.keys(True, True)), by_episode=by_episode(rows))
    finally:
        try:
            collector.shutdown()
        finally:
            policy_server.shutdown()
            policy_server.transport.close()
        emit(event="after", report=run.report.data if run.report else None,
             episodes=[e.summary() for e in run.episodes()] if run.run_dir else [])


if __name__ == "__main__":
    main()
