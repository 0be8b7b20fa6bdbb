"""The local inference server's requests and replies in torchrl's ``ProcessSlotTransport`` (shared memory).

Every layout is known before any process starts, never read from an env:

- a request holds the backend's declared observation (:meth:`topo.backends.base.Backend.observation_layout`,
  one layout for every worker of the plan) for a subcollector's workers; a string (the instruction) travels
  as UTF-8 bytes of a fixed width (the plan's longest instruction, at least ``TEXT_BYTES``) and is decoded
  back in the server before the forward;
- a reply holds the policy's out_keys packed into ``REPLY_BYTES`` bytes per env (``REPLY``) and the server's
  ``policy_version``. How the out_keys pack (key, dtype, shape) the server finds with one forward on a
  zero request when it starts, and records in its marker; each client unpacks with that record.

Each subcollector owns one slot (one request in flight); a restarted subcollector takes over the slot of
the process it replaces (:meth:`topo.launch.policy.Placement.restart_factory`).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase

from topo.backends import get_backend

REPLY = "topo_reply"
REPLY_BYTES = 8192  # per env: a reply's out_keys packed (an action chunk of 50 x 32 float32 takes 6400)
TEXT_BYTES = 256  # per env: the least width of a string's UTF-8 bytes


@dataclass(frozen=True)
class Layout:
    """One slot's request: ``workers`` rows of ``keys`` (key -> (shape, dtype name)); strings ``text_bytes`` wide."""

    workers: int
    keys: dict[tuple[str, ...], tuple[tuple[int, ...], str]]
    text_bytes: int

    @property
    def text_keys(self) -> list[tuple[str, ...]]:
        return [key for key, (_, dtype) in self.keys.items() if dtype == "str"]


class Inherited:
    """``obj`` pickled by multiprocessing's own pickler even inside cloudpickle: torchrl wraps each policy factory
    in a ``CloudpickleWrapper``, whose pickler would copy a slot's shared tensors and refuses the transport's shared
    ctypes arrays. Pickled while a process starts (its file descriptors travel with it), it unpickles as ``obj``."""

    def __init__(self, obj: Any):
        self.obj = obj

    def __reduce__(self):
        from multiprocessing.context import get_spawning_popen
        from multiprocessing.reduction import ForkingPickler

        popen = get_spawning_popen()
        if getattr(popen, "method", None) == "spawn" and isinstance(getattr(popen, "_fds", None), list):
            # this pickler's memo is not the process's: a shared-memory arena it holds besides this object (a shared
            # replay buffer's counters live in the same multiprocessing heap) is handed to the child twice, and
            # Python 3.11's spawn refuses a file descriptor listed twice ("bad value(s) in fds_to_keep"). A
            # forkserver's child finds each by its place in the list, so there the list stays as it is.
            popen._fds = _UniqueFds(popen._fds)
        return pickle.loads, (bytes(ForkingPickler.dumps(self.obj)),)


class _UniqueFds(list):
    """A spawning process's file descriptors to keep, each once (the child gets the same number either way)."""

    def append(self, fd: int) -> None:
        if fd not in self:
            super().append(fd)


def layout(plan: dict[str, Any]) -> tuple[Layout | None, str]:
    """The slot layout of ``plan``'s requests, or None and why the server keeps torchrl's manager-backed queue."""
    backend = get_backend(plan["env"]["backend"])
    sizes = {sub["num_workers"] for sub in plan["subcollectors"]}
    if len(sizes) != 1:
        return None, f"subcollectors of unequal sizes {sorted(sizes)}: one slot layout serves them all"
    rows = [row for sub in plan["subcollectors"] for row in sub["workers"]]
    declared = [backend.observation_layout(row["kwargs"]["env"]) for row in rows]
    if any(d is None for d in declared):
        return None, f"backend {backend.name!r} declares no observation layout (Backend.observation_layout)"
    if any(d != declared[0] for d in declared):
        return None, "the workers' declared observation layouts differ"
    longest = max((len((row.get("instruction") or "").encode()) for row in rows), default=0)
    return Layout(sizes.pop(), dict(declared[0]), max(TEXT_BYTES, longest)), ""


def request_spec(lay: Layout) -> TensorDict:
    """A zero request of ``lay``: what the transport's request slots are shaped after."""
    out = TensorDict({}, batch_size=[lay.workers])
    for key, (shape, dtype) in lay.keys.items():
        if dtype == "str":
            out.set(key, torch.zeros(lay.workers, lay.text_bytes, dtype=torch.uint8))
        else:
            out.set(key, torch.zeros(lay.workers, *shape, dtype=getattr(torch, dtype)))
    return out


def response_spec(workers: int) -> TensorDict:
    """The transport's reply slot: the packed out_keys and the version the server stamps."""
    return TensorDict({REPLY: torch.zeros(workers, REPLY_BYTES, dtype=torch.uint8),
                       "policy_version": torch.zeros(workers, dtype=torch.long)}, batch_size=[workers])


def encode(td: TensorDictBase, lay: Layout) -> TensorDictBase:
    """A client's request: the declared keys of ``td``, each string as its UTF-8 bytes."""
    out = td.select(*lay.keys, strict=True)
    for key in lay.text_keys:
        out.set(key, encode_text(_strings(td.get(key), lay.workers), lay.text_bytes))
    return out


_encoded: dict[tuple, torch.Tensor] = {}  # a subcollector's instructions rarely change: each step finds them here
_decoded: dict[bytes, NonTensorStack] = {}
_CACHED = 256


def encode_text(strings: list[str], width: int) -> torch.Tensor:
    """``strings`` as a uint8 ``[len, width]`` tensor, zero-padded (the same tensor for the same strings)."""
    key = (tuple(strings), width)
    found = _encoded.get(key)
    if found is None:
        buffer = bytearray()
        for text in strings:
            data = (text or "").encode()
            if len(data) > width:
                raise ValueError(f"a string of {len(data)} UTF-8 bytes does not fit the server's slot of {width}: "
                                 f"{text!r}")
            buffer += data.ljust(width, b"\0")
        found = torch.frombuffer(buffer, dtype=torch.uint8).reshape(len(strings), width)
        _remember(_encoded, key, found)
    return found


def decode_text(data: torch.Tensor) -> NonTensorStack:
    """The strings of a uint8 ``[*batch, width]`` tensor, as a stack shaped like its batch."""
    raw = data.cpu().contiguous().numpy()
    key = raw.tobytes() + bytes(str(raw.shape), "ascii")
    found = _decoded.get(key)
    if found is None:
        flat = [row.tobytes().rstrip(b"\0").decode() for row in raw.reshape(-1, raw.shape[-1])]
        found = NonTensorStack(*flat).reshape(data.shape[:-1])
        _remember(_decoded, key, found)
    return found


def _remember(cache: dict, key, value) -> None:
    if len(cache) >= _CACHED:
        cache.clear()
    cache[key] = value


def _strings(value: Any, n: int) -> list[str]:
    """The ``n`` strings of a request's string leaf."""
    if isinstance(value, NonTensorStack) and value.batch_dims == 1:
        return [getattr(item, "data", item) for item in value.tensordicts]
    value = value.tolist() if hasattr(value, "tolist") else value
    return [value] * n if isinstance(value, str) else list(value)


def decode_request(td: TensorDictBase, lay: Layout) -> TensorDictBase:
    """In the server: each string key's bytes back to strings."""
    for key in lay.text_keys:
        td.set(key, decode_text(td.get(key)))
    return td


def reply_layout(td: TensorDictBase, out_keys: list) -> list[tuple[Any, str, list[int]]]:
    """How the out_keys of a forward's output ``td`` (batch ``[k, workers]``) pack: (key, dtype name, shape)."""
    out = []
    for key in out_keys:
        value = td.get(key)
        out.append((list(key) if isinstance(key, tuple) else key, str(value.dtype).removeprefix("torch."),
                    list(value.shape[td.batch_dims:])))
    size = sum(_nbytes(dtype, shape) for _, dtype, shape in out)
    if size > REPLY_BYTES:
        raise ValueError(f"the policy's out_keys take {size} bytes per env, over the server slot's {REPLY_BYTES}")
    return out


def pack(td: TensorDictBase, packing: list) -> TensorDict:
    """In the server: a forward's output as the reply slot's bytes, ``[*batch, REPLY_BYTES]``."""
    rows = td.batch_size.numel()
    parts = [td.get(_key(key)).reshape(rows, -1).contiguous().view(torch.uint8) for key, _, _ in packing]
    data = torch.cat(parts, dim=1) if parts else torch.zeros(rows, 0, dtype=torch.uint8, device=td.device)
    data = torch.nn.functional.pad(data, (0, REPLY_BYTES - data.shape[1]))
    return TensorDict({REPLY: data.reshape(*td.batch_size, REPLY_BYTES)}, batch_size=td.batch_size)


def unpack(reply: TensorDictBase, packing: list) -> TensorDict:
    """In a client: the reply slot's bytes back to the out_keys, with the server's ``policy_version``."""
    data, offset = reply.get(REPLY), 0
    out = TensorDict({"policy_version": reply.get("policy_version").clone()}, batch_size=reply.batch_size)
    for key, dtype, shape in packing:
        size = _nbytes(dtype, shape)
        chunk = data[..., offset:offset + size].clone()
        out.set(_key(key), chunk.view(getattr(torch, dtype)).reshape(*reply.batch_size, *shape))
        offset += size
    return out


def _nbytes(dtype: str, shape: list[int]) -> int:
    n = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    for dim in shape:
        n *= dim
    return n


def _key(key):
    return tuple(key) if isinstance(key, list) else key
