"""Seed states as data: plain JSON and numpy arrays to bytes and back, never a pickle.

A seed state (:func:`topo.envs.recording.seed_state`) is a tree of numpy's and Python's RNG states, torch's
as a byte array, and an env's counters, small tensors and generator states. :func:`encode` writes such a
tree as :data:`MAGIC`, one line of JSON, then the arrays' bytes. In the JSON: None, bool, int, float and str
as themselves, a list as a list, a tuple as ``{"t": [...]}``, a dict of str keys as ``{"d": {...}}``, a
numeric numpy array as ``{"a": [dtype, shape, offset]}`` (its bytes at ``offset`` after the line; a numpy
scalar: ``{"n": ...}``, the same), and a long tuple of ints (Python's RNG state) as ``{"i": [format, n,
offset]}``, uint32 or int64 bytes. Anything else is :class:`Unencodable`: the part is recorded without it, never
pickled. :func:`decode` reads only that, within bounds (the blob's size, its depth, each array's bytes
within the blob), so a blob from elsewhere is data and nothing else; what it cannot read is
:class:`NotAState`, saying why.
"""
from __future__ import annotations

import functools
import json
import struct
from typing import Any

import numpy as np

MAGIC = b"topo.state/1\n"
MAX_DEPTH = 16  # a seed state nests 6 levels (env -> nested -> generator state -> dict -> array)
_KINDS = "biufc"  # numpy dtypes an array may have: bool, ints, floats, complex (never object, void, str)


class Unencodable(TypeError):
    """A value a seed state cannot hold as data (an object, a dict with other keys than str)."""


class NotAState(ValueError):
    """Bytes that are no seed state this topo reads; the message says what they are."""


def encode(value: Any) -> bytes:
    """``value`` as bytes :func:`decode` reads back equal (arrays by dtype, shape and bytes)."""
    raw: list[bytes] = []
    tree = _data(value, 0, raw, [0])
    return b"".join([MAGIC, _JSON.encode(tree).encode(), b"\n", *raw])


def decode(blob: bytes, limit: int) -> Any:
    """The value :func:`encode` wrote; :class:`NotAState` for anything else, or for more than ``limit`` bytes."""
    if len(blob) > limit:
        raise NotAState(f"{len(blob):,} bytes (limit {limit:,})")
    if not blob.startswith(MAGIC):
        if blob.startswith(b"topo.state/"):
            head = blob[:40].partition(b"\n")[0].decode(errors="replace")
            raise NotAState(f"written by a newer topo ({head!r}; this topo reads {MAGIC.strip().decode()!r})")
        if blob[:1] == b"\x80":
            raise NotAState("a pickle, which topo never unpickles (topo recorded seed states as pickles before "
                            f"{MAGIC.strip().decode()!r}: such a run is replayed by the topo that recorded it)")
        raise NotAState(f"not a seed state (it does not begin with {MAGIC.strip().decode()!r})")
    end = blob.find(b"\n", len(MAGIC))
    if end < 0:
        raise NotAState("cut short (no end to its JSON line)")
    try:
        tree = json.loads(blob[len(MAGIC):end])
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, an int of too many digits
        raise NotAState(f"not JSON: {exc}") from None
    return _value(tree, 0, memoryview(blob)[end + 1:])


_JSON = json.JSONEncoder(separators=(",", ":"), check_circular=False)  # made once; the tree is acyclic (built here)
_PLAIN = {type(None), bool, int, float, str}
_INTS = {int}
_MIN_INTS = 16  # a tuple of at least this many ints is written as bytes (random's state: 625)
_INT_FORMATS = ("I", "q")  # uint32, else int64 (little-endian)


def _data(value: Any, depth: int, raw: list[bytes], at: list[int]) -> Any:
    """The JSON of ``value``; its arrays' bytes appended to ``raw``, ``at[0]`` their end so far. Plain items of a
    container are taken as they are, without a call (most of a seed state: an env's counters and flags)."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if depth > MAX_DEPTH:
        raise Unencodable(f"nested more than {MAX_DEPTH} levels deep")
    depth += 1
    if kind is tuple:
        if len(value) >= _MIN_INTS and set(map(type, value)) == _INTS:
            for code in _INT_FORMATS:
                try:
                    return {"i": [code, len(value), _put(struct.pack(f"<{len(value)}{code}", *value), raw, at)]}
                except struct.error:  # past this format's range: the next one, or a plain tuple
                    continue
        return {"t": [v if type(v) in _PLAIN else _data(v, depth, raw, at) for v in value]}
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise Unencodable("a dict whose keys are not all str")
        return {"d": {k: v if type(v) in _PLAIN else _data(v, depth, raw, at) for k, v in value.items()}}
    if kind is list:
        return [v if type(v) in _PLAIN else _data(v, depth, raw, at) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.dtype.kind not in _KINDS or array.dtype.fields is not None:
            raise Unencodable(f"a numpy array of dtype {array.dtype}")
        cell = [array.dtype.str, list(array.shape), _put(array.tobytes(), raw, at)]
        return {"a": cell} if isinstance(value, np.ndarray) else {"n": cell}
    raise Unencodable(f"a {kind.__module__}.{kind.__qualname__}")


def _put(data: bytes, raw: list[bytes], at: list[int]) -> int:
    raw.append(data)
    at[0] += len(data)
    return at[0] - len(data)


def _value(tree: Any, depth: int, raw: memoryview) -> Any:
    if depth > MAX_DEPTH:
        raise NotAState(f"nested more than {MAX_DEPTH} levels deep")
    kind = type(tree)
    if kind in _PLAIN:
        return tree
    depth += 1
    if kind is list:
        return [v if type(v) in _PLAIN else _value(v, depth, raw) for v in tree]
    if kind is not dict or len(tree) != 1:
        raise NotAState(f"a {kind.__name__} where a value was expected")
    (tag, inner), = tree.items()
    if tag == "t" and type(inner) is list:
        return tuple([v if type(v) in _PLAIN else _value(v, depth, raw) for v in inner])
    if tag == "d" and type(inner) is dict:
        return {k: v if type(v) in _PLAIN else _value(v, depth, raw) for k, v in inner.items()}
    if tag == "i" and type(inner) is list and len(inner) == 3 and inner[0] in _INT_FORMATS \
            and all(type(n) is int and n >= 0 for n in inner[1:]):
        code, n, offset = inner
        size = n * struct.calcsize(code)
        if offset + size > len(raw):
            raise NotAState(f"{n:,} ints ({size:,} bytes at {offset:,}) past the {len(raw):,} bytes the blob holds")
        return struct.unpack_from(f"<{n}{code}", raw, offset)
    if tag in ("a", "n"):
        array = _array(inner, raw)
        return array if tag == "a" else array[()]
    raise NotAState(f"an unknown tag {tag!r}")


def _array(cell: Any, raw: memoryview) -> np.ndarray:
    if type(cell) is not list or len(cell) != 3 or type(cell[0]) is not str or type(cell[2]) is not int \
            or type(cell[1]) is not list or not all(type(n) is int and 0 <= n for n in cell[1]) or cell[2] < 0:
        raise NotAState("an array that is not [dtype, shape, offset]")
    dtype = _dtype(cell[0])
    size = dtype.itemsize
    for n in cell[1]:
        size *= n
    if cell[2] + size > len(raw):
        raise NotAState(f"an array of shape {cell[1]} and dtype {dtype} ({size:,} bytes at {cell[2]:,}) past the "
                        f"{len(raw):,} bytes the blob holds")
    return np.frombuffer(raw[cell[2]:cell[2] + size], dtype=dtype).reshape(cell[1]).copy()


@functools.lru_cache(maxsize=64)
def _dtype(name: str) -> np.dtype:
    """The numeric dtype ``name`` names (read once: a seed state holds a few, every array names one)."""
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise NotAState(f"an array of an unknown dtype {name!r}") from None
    if dtype.kind not in _KINDS or dtype.fields is not None:
        raise NotAState(f"an array of dtype {dtype} (only numbers are read)")
    return dtype
