"""An instruction (a string) as a tensor of utf-8 bytes, where a string cannot go: the async mode's shared-memory
slots, and a replay buffer the subcollectors fill.

A shared replay buffer (``TensorDictReplayBuffer(LazyTensorStorage(n, shared_init=True), shared=True)``) shares
its tensors between processes, not its non-tensor entries: each process keeps its own copy of those, so the
trainer reads the instruction the storage was initialised with on every row, and each write into a copy costs
time in proportion to the storage's capacity (measured: 80 % of a toy subcollector's time, 14x slower than the
iterating loop, at 10,000 rows). :class:`Buffer` is that buffer as the subcollectors see it: each batch written
with its instruction as :data:`INSTRUCTION_KEY` bytes instead of a string; :func:`decode` reads them back.
"""
from __future__ import annotations

from typing import Any

import torch

from topo.backends.base import INSTRUCTION_BYTES

INSTRUCTION_KEY = ("topo", "instruction")  # uint8 [..., INSTRUCTION_BYTES]: the utf-8 instruction, zero-padded


def encode(text: Any) -> torch.Tensor:
    """An instruction (a string, NonTensorData or None) as ``INSTRUCTION_BYTES`` zero-padded utf-8 bytes."""
    text = getattr(text, "data", text)
    raw = ("" if text is None else str(text)).encode()[:INSTRUCTION_BYTES]
    out = torch.zeros(INSTRUCTION_BYTES, dtype=torch.uint8)
    out[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else out[:0]
    return out


def decode(tensor: torch.Tensor) -> list[str]:
    """Encoded instructions (any leading shape) back to strings, flattened in order."""
    return [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace") for row in tensor.reshape(-1, INSTRUCTION_BYTES)]


def as_bytes(batch: Any, key: str) -> Any:
    """``batch`` without its ``key`` strings (at the root and under ``next``), with them as bytes at
    :data:`INSTRUCTION_KEY` (a new tensordict: the collector's own buffers are untouched)."""
    text = batch.get(key, None)
    if text is None:
        return batch
    words = text.tolist() if hasattr(text, "tolist") else [text] * batch.numel()
    flat = _flatten(words) if isinstance(words, list) else [words] * batch.numel()
    out = batch.exclude(key, ("next", key))
    out.set(INSTRUCTION_KEY, torch.stack([encode(w) for w in flat]).reshape(*batch.batch_size, INSTRUCTION_BYTES))
    return out


def _flatten(value: Any) -> list:
    return [x for item in value for x in _flatten(item)] if isinstance(value, list) else [value]


class Buffer:
    """The caller's replay buffer as the subcollectors see it: :meth:`extend` writes each batch :func:`as_bytes`;
    everything else is the buffer's own (the trainer keeps and reads the buffer it made)."""

    def __init__(self, buffer: Any, key: str):
        self._topo_buffer, self._topo_key = buffer, key

    def extend(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return self._topo_buffer.extend(as_bytes(data, self._topo_key), *args, **kwargs)

    def __len__(self) -> int:
        return len(self._topo_buffer)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_topo_"):  # not set yet: unpickling
            raise AttributeError(name)
        return getattr(self._topo_buffer, name)
