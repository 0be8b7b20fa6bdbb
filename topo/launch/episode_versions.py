"""The subcollector's part of episode provenance: which policy versions acted in which episode.

Each batch of a subcollector holds, per step, the episode it belongs to (``topo_episode``, stamped by
the worker: :mod:`topo.envs.recording`) and the version of the weights that chose its action
(``policy_version``). :func:`record` appends one line per batch to the subcollector's
``episodes/versions.sub<c>.r<k>.jsonl``: ``[episode id, version, steps]`` for each pair in it, the
join :class:`topo.runtime.episodes.Episodes` reads.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import torch

from topo.runtime.episodes import KEY, versions_file


def record(run_dir: str, subcollector: int, restart: int, number: int, batch: Any) -> None:
    """Append batch ``number``'s (episode, policy version, steps) triples; nothing when it has no episode ids."""
    ids = batch.get(KEY, None)
    if ids is None:
        return
    ids = ids.reshape(-1)
    versions = batch.get("policy_version", None)
    if versions is None or versions.numel() != ids.numel():
        versions = torch.full_like(ids, -1)  # no policy (random actions), or one that stamps no per-step version
    versions = versions.reshape(-1).to(torch.int64)
    keep = ids >= 0  # an eval worker's idle steps belong to no episode
    pairs, counts = torch.unique(torch.stack([ids[keep], versions[keep]], dim=1), dim=0, return_counts=True)
    triples = [[e, None if v < 0 else v, n] for (e, v), n in zip(pairs.tolist(), counts.tolist())]
    path = versions_file(run_dir, subcollector, restart)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps({"batch": number, "time": time.time(), "pairs": triples}) + "\n")
