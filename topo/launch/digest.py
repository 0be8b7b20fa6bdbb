"""The run's digest: a running sha256 over every batch the trainer received, in order.

Two runs compare in one line: same digest, same batches (observations, actions, rewards, episode ids, policy
versions: every tensor of every batch, with its key, dtype and shape). Left out: non-tensor entries (an
instruction's text: the plan decides it), and torchrl's ``("collector", "traj_ids")``, which the subcollectors
draw from one shared counter in the order they happen to get there (``topo_episode`` names each episode the
same way in every run). The report carries it (``batches``).
"""
from __future__ import annotations

import hashlib
import time
from typing import Any

import torch

UNORDERED = {("collector", "traj_ids")}  # keys whose values depend on the processes' timing, not on the plan


class BatchDigest:
    """``update(batch)`` for each batch, in order; ``hexdigest`` names them all."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.batches = 0
        self.seconds = 0.0  # spent hashing, in the trainer

    def update(self, batch: Any) -> None:
        """Fold ``batch`` (a TensorDict) in: each tensor leaf in sorted key order, its key, dtype, shape and bytes."""
        started = time.perf_counter()
        for key in sorted(batch.keys(include_nested=True, leaves_only=True), key=_name):
            value = batch.get(key, None)
            if key in UNORDERED or not isinstance(value, torch.Tensor):  # a stack's missing entry reads None
                continue
            self._sha.update(f"{_name(key)}|{value.dtype}|{tuple(value.shape)}|".encode())
            self._sha.update(memoryview(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
        self.batches += 1
        self.seconds += time.perf_counter() - started

    @property
    def hexdigest(self) -> str:
        return self._sha.hexdigest()

    def describe(self) -> dict[str, Any]:
        """The report's ``batches`` section: the digest, the batches it covers, its cost per batch."""
        return {"sha256": self.hexdigest, "count": self.batches,
                "ms_per_batch": round(1000 * self.seconds / self.batches, 3) if self.batches else None}


def attach(collector: Any, digest: BatchDigest) -> None:
    """Fold every batch ``collector`` yields into ``digest``: torchrl's collectors through their ``iterator``
    (which ``__iter__`` and the trajectory iterator call), topo's Ray collector through ``on_batch``."""
    if not hasattr(collector, "iterator"):
        collector.on_batch = digest.update
        return
    inner = collector.iterator

    def iterator():
        for batch in inner():
            digest.update(batch)
            yield batch

    collector.iterator = iterator


def _name(key: str | tuple) -> str:
    return key if isinstance(key, str) else "/".join(key)
