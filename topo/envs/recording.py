"""In an env worker: the episode id on every step, and the records it resolves to (:mod:`topo.runtime.episodes`).

:func:`wrap` puts :class:`EpisodeLog` on the env a worker built (the key is added to the env's spec, so
``ParallelEnv`` reads it from the worker's metadata like any other). At each reset it takes
the seed state first (:func:`seed_state`: the global RNGs and the env's own counters and generators,
what :mod:`topo.runs.replay` restores), then writes the episode's ``start``; at its end (done, the next reset,
or ``close``) its ``end``. With ``record_actions`` each step's actions, reward and a digest of what it
returned (:func:`digest`) are kept and written in chunks (an ``.npz`` in the worker life's ``.steps`` file
every :data:`FLUSH_STEPS` steps or :data:`FLUSH_S` seconds, and at the end).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import os
import random
import time
import zlib
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import Unbounded
from torchrl.envs import EnvBase

from topo.envs import seed_codec
from topo.runtime.episodes import KEY, EpisodeId, life_file
from topo.compiler.limits import MAX_RECORD_BYTES

MAX_TENSOR = 1 << 16  # env attributes: tensors up to this many elements are state; larger ones are data
_NESTED = ("_env", "env", "inner")  # where a wrapper keeps what it wraps: their generators are state too
IDLE = -1  # the id of an eval worker's idle step (no episode)
FLUSH_STEPS, FLUSH_S = 16, 1.0  # recorded steps are written at least this often (steps, seconds) and at the end
_GENERIC_MODULES = ("builtins", "torchrl.envs.common", "torch.nn.modules.module")


class LifeWriter:
    """Appends one worker life's records (``episodes/<life>.jsonl``) and step files (``<life>.steps``).

    ``keep`` (``launch.retain_episodes``): once the file holds ``2 * keep`` episodes, it is rewritten with the last
    ``keep`` (:meth:`compact`, after an episode's end), and again when the life closes: a life's records hold between
    ``keep`` and ``2 * keep`` episodes while it runs, ``keep`` after it closed."""

    def __init__(self, run_dir: str, life: str, keep: int | None = None):
        self.records = life_file(run_dir, life)
        self.steps = life_file(run_dir, life, ".steps")
        self.keep = keep
        self.held = 0  # episodes started in the records file
        os.makedirs(os.path.dirname(self.records), exist_ok=True)
        self._stored: set[str] = set()  # blobs already written to this life's file
        self._last: dict[str, tuple[Any, str]] = {}  # each seed-state part at the last reset, and its digest
        self._records = self._steps = None  # the files, opened at the first write, closed with the process

    def blobs(self, parts: dict[str, Any]) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """(name -> digest, the blobs not yet written: digest -> base64, name -> why it is not recorded) of a
        :func:`seed_state`; a part equal to the previous reset's is not encoded again, one that is no plain data
        (:class:`~topo.envs.seed_codec.Unencodable`) is left out."""
        refs, new, skipped = {}, {}, {}
        for name, value in parts.items():
            last = self._last.get(name)
            if last is not None and same(last[0], value):
                refs[name] = last[1]
                continue
            try:
                blob = encode(name, value)
            except seed_codec.Unencodable as exc:
                skipped[name] = f"it holds {exc}, which topo records as data only"
                continue
            key = hashlib.blake2b(blob, digest_size=16).hexdigest()
            refs[name] = key
            self._last[name] = (value, key)
            if key not in self._stored:
                self._stored.add(key)
                new[key] = base64.b64encode(compressed(blob)).decode()
        return refs, new, skipped

    def write(self, record: dict[str, Any]) -> None:
        """One line, written through at once (a worker killed after it loses nothing before it)."""
        if self._records is None:
            self._records = open(self.records, "a", buffering=1)
        self._records.write(json.dumps(record) + "\n")
        self.held += record["event"] == "start"
        if record["event"] == "end" and self.keep is not None and self.held >= 2 * self.keep:
            self.compact()

    def compact(self) -> None:
        """Rewrite the records (and steps) file with the last ``keep`` episodes only, each file atomically (steps
        first): a seed-state blob a kept start refers to moves to the first kept start that needs it, a kept chunk of
        steps to its new offset. Called between episodes."""
        if self.keep is None or self.held <= self.keep:
            return
        self.close()
        with open(self.records, "rb") as f:
            records = [json.loads(line) for line in f]
        starts = [i for i, r in enumerate(records) if r["event"] == "start"]
        dropped, kept = records[:starts[-self.keep]], records[starts[-self.keep]:]
        pool = {key: text for r in dropped for key, text in (r.get("blobs") or {}).items()}
        held: set[str] = set()
        for r in kept:
            if r["event"] == "start":
                moved = {ref: pool[ref] for ref in r["state"].values() if ref in pool and ref not in held}
                if moved:
                    r["blobs"] = {**moved, **(r.get("blobs") or {})}
                held.update(r.get("blobs") or {})
        if any(r["event"] == "steps" for r in kept):
            with open(self.steps, "rb") as f, open(self.steps + ".tmp", "wb") as g:
                for r in kept:
                    if r["event"] == "steps":
                        f.seek(r["at"][0])
                        r["at"] = [g.tell(), r["at"][1]]
                        g.write(f.read(r["at"][1]))
            os.replace(self.steps + ".tmp", self.steps)
        elif os.path.exists(self.steps):
            os.unlink(self.steps)
        with open(self.records + ".tmp", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        os.replace(self.records + ".tmp", self.records)
        self._stored, self.held = held, self.keep

    def close(self) -> None:
        for f in (self._records, self._steps):
            if f is not None:
                f.close()
        self._records = self._steps = None

    def append_steps(self, blob: bytes) -> tuple[int, int]:
        """Append ``blob`` to the steps file: its (offset, length)."""
        if self._steps is None:
            self._steps = open(self.steps, "ab", buffering=0)
        offset = self._steps.tell()
        self._steps.write(blob)
        return offset, len(blob)


class EpisodeLog:
    """Stamps ``topo_episode`` on every step of one env and records each episode of this worker life.

    :meth:`install` wraps the env's ``_reset`` and ``_step`` (instance attributes, no subclass: a
    ``TransformedEnv`` would clone every step's input) and adds the key to its observation spec."""

    def __init__(self, writer: LifeWriter, *, row: int, restart: int, seed: int | None, eval: bool = False,
                 actions: bool = False):
        self.writer, self.row, self.restart, self.seed, self.is_eval, self.actions = writer, row, restart, seed, eval, actions
        self.episodes = 0  # started in this life
        self._id = _ids(IDLE)
        self._open = False
        self._steps = 0
        self._return = 0.0
        self._success: bool | None = None  # None: the env reports no success
        self._acted: dict[str, list] = {}
        self._digests: list[int] = []
        self._rewards: list[float] = []
        self._action_keys: list = []
        self._flushed_at = 0.0
        self._names: dict | None = None  # the env's state attributes (:func:`state_names`), found at its first reset
        self._env_steps: int | None = None  # the base env's steps in the open episode, under a stack (else None)

    def install(self, env: EnvBase, base: EnvBase | None = None) -> EnvBase:
        """``env`` recording its episodes; ``base``: the env under ``env``'s transforms (its seed state is what
        decides an episode, its steps are the episode's ``env_steps``), None: ``env`` itself."""
        spec = env.full_observation_spec.clone()
        spec[KEY] = Unbounded(shape=env.batch_size, dtype=torch.int64, device=env.device)
        env.full_observation_spec = spec
        self._action_keys = list(env.full_action_spec.keys(True, True))
        reset, step = env._reset, env._step
        inner = env if base is None else base

        def _reset(tensordict=None, **kwargs):
            self.finish("reset")
            if self._names is None:
                self._names = state_names(inner)
            state = seed_state(inner, self._names)
            out = reset(tensordict, **kwargs)
            self.started(inner, out, state)
            return out

        def _step(tensordict):
            out = step(tensordict)
            self.stepped(tensordict, out)
            return out

        env._reset, env._step = _reset, _step
        if inner is not env:
            from topo.runtime.transforms import count_steps

            self._env_steps = 0
            count_steps(inner, self._env_stepped)
        return env

    def _env_stepped(self) -> None:
        if self._open:
            self._env_steps += 1

    def started(self, env: EnvBase, out: TensorDictBase, state: dict[str, Any]) -> None:
        if "eval_episode" in out.keys() and int(_scalar(out.get("eval_episode"))) == IDLE:
            self._id = _ids(IDLE, env.batch_size)
        else:
            value = int(EpisodeId(self.row, self.restart, self.episodes, eval=self.is_eval))
            self._id = _ids(value, env.batch_size)
            self.episodes += 1
            self._start(env, out, state, value)
        out.set(KEY, self._id)

    def stepped(self, tensordict: TensorDictBase, out: TensorDictBase) -> None:
        if self._open:
            self._steps += 1
            reward = out.get("reward", None)
            reward = 0.0 if reward is None else float(reward.sum())
            self._return += reward
            success = out.get("success", None)
            if success is not None:
                self._success = bool(self._success) or bool(success.any())
            if self.actions:
                self._rewards.append(reward)
                for key in self._action_keys:
                    self._acted.setdefault(_name(key), []).append(tensordict.get(key).detach().cpu().numpy().copy())
                self._digests.append(digest(out))
                if len(self._rewards) >= FLUSH_STEPS or time.monotonic() - self._flushed_at >= FLUSH_S:
                    self._flush()
            if bool(out.get("done").any()):
                terminated = out.get("terminated", None)
                self.finish("terminated" if terminated is not None and bool(terminated.any()) else "truncated")
        out.set(KEY, self._id)

    def _start(self, env: EnvBase, out: TensorDictBase, state: dict[str, Any], value: int) -> None:
        refs, new, skipped = self.writer.blobs(state)
        init_state = _optional(out, "eval_init_state") if "eval_init_state" in out.keys() else _init_state(env)
        record = {"event": "start", "id": value, "time": time.time(), "seed": self.seed, "state": refs,
                  "init_state": None if init_state == -1 else init_state, "group_id": _optional(out, "group_id"),
                  "instruction": _instruction(out)}
        for key in ("eval_round", "eval_episode"):
            if key in out.keys():
                record[key] = int(_scalar(out.get(key)))
        if new:
            record["blobs"] = new
        if skipped:
            record["unrecorded"] = skipped
        self.writer.write(record)
        self._open, self._steps, self._return, self._success = True, 0, 0.0, None
        if self._env_steps is not None:
            self._env_steps = 0
        self._acted, self._digests, self._rewards = {}, ([digest(out)] if self.actions else []), []
        self._flushed_at = time.monotonic()

    def _flush(self) -> None:
        """Write the steps kept since the last flush as one chunk (an ``.npz`` in the steps file, and a ``steps``
        line saying where): a worker killed mid-episode leaves every chunk written before."""
        if not self._digests and not self._rewards:
            return
        buffer = io.BytesIO()
        arrays = {f"action.{name}": np.stack(values) for name, values in self._acted.items()}
        np.savez(buffer, digests=np.asarray(self._digests, dtype=np.int64),
                 rewards=np.asarray(self._rewards, dtype=np.float64), **arrays)
        at = self.writer.append_steps(buffer.getvalue())
        self.writer.write({"event": "steps", "id": int(self._id.reshape(-1)[0]), "at": at})
        self._acted, self._digests, self._rewards = {}, [], []
        self._flushed_at = time.monotonic()

    def finish(self, how: str) -> None:
        """End the open episode (``how``: terminated, truncated, reset, closed): its ``end`` record."""
        if not self._open:
            return
        self._open = False
        if self.actions:
            self._flush()
        record = {"event": "end", "id": int(self._id.reshape(-1)[0]), "time": time.time(), "steps": self._steps,
                  "return": self._return, "how": how, "success": self._success}
        if self._env_steps is not None:
            record["env_steps"] = self._env_steps  # ``steps`` are decisions
        self.writer.write(record)


def wrap(env: EnvBase, run_dir: str, worker: dict, seed: int | None, restart: int, actions: bool,
         keep: int | None = None, base: EnvBase | None = None) -> EnvBase:
    """``env`` with its episodes recorded in ``run_dir`` under this worker life (``close`` ends the open one);
    ``keep``: only the last ``keep`` episodes' records are kept (:class:`LifeWriter`); ``base``: the env under
    ``env``'s transforms (:meth:`EpisodeLog.install`)."""
    is_eval = worker.get("role") == "eval"
    key = EpisodeId(worker["global_index"], restart, 0, eval=is_eval)
    log = EpisodeLog(LifeWriter(run_dir, key.life, keep), row=key.row, restart=restart, seed=seed, eval=is_eval,
                     actions=actions)
    log.install(env, None if base is env else base)
    close = env.close

    def closing(*args: Any, **kwargs: Any) -> Any:
        log.finish("closed")
        log.writer.compact()
        env.__dict__.pop("close", None)  # once; later calls (``__del__``) go to the class
        return close(*args, **kwargs)

    env.close = closing
    return env


# -- the seed state at a reset, and what a step returned ------------------------------------------

def seed_state(env: Any, names: dict | None = None) -> dict[str, Any]:
    """What decides an episode's reset besides the env's construction and seed: the global RNGs, and the env's
    plain attributes (counters, small tensors) and generators, with the generators of what it wraps (``names``:
    :func:`state_names` of ``env``, found once). :func:`encode` makes each part bytes."""
    return {"torch": torch.get_rng_state().numpy(), "numpy": np.random.get_state(), "random": random.getstate(),
            "env": env_state(env, names=names)}


def compressed(blob: bytes) -> bytes:
    """A blob as a record holds it: its zlib stream where that is shorter (a torch generator's state is half zeros),
    else itself (:func:`topo.runtime.episodes.blob_bytes` reads both). Level 1: a toy env's seed state compresses
    4x faster than at zlib's default 6, to 0.5 % more bytes (``benchmarks/seed_state_codec.py``)."""
    packed = zlib.compress(blob, 1)
    return packed if len(packed) < len(blob) else blob


def encode(name: str, value: Any) -> bytes:
    """A :func:`seed_state` part as bytes: plain data (:mod:`topo.envs.seed_codec`), never a pickle."""
    return seed_codec.encode(value)


def same(a: Any, b: Any) -> bool:
    """Whether two seed-state parts are equal (numpy arrays by value): an unchanged part is not encoded again."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    try:  # plain values and containers of them (random's 625 ints) compare at C speed
        return type(a) is type(b) and bool(a == b)
    except (ValueError, RuntimeError):  # a container holding arrays or tensors: part by part
        pass
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def decode_seed_state(parts: dict[str, bytes]) -> dict[str, Any]:
    """A :func:`seed_state` from its parts' blobs, readable by :func:`restore_seed_state` (a part the recording
    left out is absent). :class:`~topo.envs.seed_codec.NotAState` names the part that is no seed state."""
    out = {}
    for name, blob in parts.items():
        try:
            value = seed_codec.decode(blob, MAX_RECORD_BYTES)
        except seed_codec.NotAState as exc:
            raise seed_codec.NotAState(f"its {name} state is {exc}") from None
        if name == "torch":
            if not (isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1):
                raise seed_codec.NotAState("its torch state is not a byte array")
            value = torch.from_numpy(value)
        out[name] = value
    return out


def state_names(env: Any, depth: int = 0) -> dict[str, Any]:
    """The attributes :func:`env_state` reads, found once (name -> None, or the names of what it wraps)."""
    return {name: (state_names(getattr(env, name), depth + 1) if kind == "nested" else None)
            for name, (kind, _) in env_state(env, depth).items()}


def env_state(env: Any, depth: int = 0, names: dict | None = None) -> dict[str, Any]:
    """``{attribute: value}`` of ``env``: its generators, and the plain values and small tensors that its own
    code names (:func:`own_names`: not torchrl's ``EnvBase`` bookkeeping); nested under ``_env``/``env``/
    ``inner``, the generators of what it wraps (three levels). ``names`` (:func:`state_names`): read only those."""
    out: dict[str, Any] = {}
    own = own_names(type(env)) if depth == 0 else frozenset()
    attributes = {**vars(env), **(getattr(env, "_buffers", None) or {})}  # a Module keeps tensors as buffers
    if names is not None:
        attributes = {name: attributes[name] for name in names if name in attributes}
    for name, value in attributes.items():
        if isinstance(value, torch.Generator):
            out[name] = ("torch.Generator", value.get_state().numpy())
        elif isinstance(value, np.random.Generator):
            out[name] = ("numpy.Generator", value.bit_generator.state)
        elif isinstance(value, np.random.RandomState):
            out[name] = ("numpy.RandomState", value.get_state())
        elif depth == 0 and name in own and (value is None or type(value) in (bool, int, float, str)):
            out[name] = ("value", value)
        elif depth == 0 and name in own and isinstance(value, torch.Tensor) and value.numel() <= MAX_TENSOR \
                and not value.is_meta and value.dtype != torch.bfloat16:
            out[name] = ("tensor", (value.detach().cpu().numpy().copy(), str(value.device)))
        elif name in _NESTED and depth < 3 and hasattr(value, "__dict__") and not isinstance(value, type):
            inner = env_state(value, depth + 1, names=None if names is None else names.get(name))
            if inner:
                out[name] = ("nested", inner)
    return out


@functools.lru_cache(maxsize=None)
def own_names(cls: type) -> frozenset[str]:
    """The attribute names the methods of ``cls`` and its bases use, torchrl's ``EnvBase`` and torch's
    ``Module`` aside: an env's episode counters and targets, not the base class's caches and flags."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__ in _GENERIC_MODULES:
            continue
        for member in vars(klass).values():
            for fn in (member, getattr(member, "fget", None), getattr(member, "__func__", None)):
                code = getattr(fn, "__code__", None)
                if code is not None:
                    names.update(_code_names(code))
    return frozenset(names)


def _code_names(code) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def restore_env_state(env: Any, state: dict[str, Any], depth: int = 0) -> None:
    """Put ``state`` (:func:`env_state`) back on ``env``: only what :func:`env_state` records of such an env (the
    generators it has, the nested envs it wraps, and at the top the plain values and small tensors its own code
    names); a state that sets anything else is :class:`~topo.envs.seed_codec.NotAState`."""
    if not isinstance(state, dict):
        raise seed_codec.NotAState("its env state is not a mapping")
    own = own_names(type(env)) if depth == 0 else frozenset()
    for name, entry in state.items():
        if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)):
            raise seed_codec.NotAState(f"its env state's {name!r} is not a (kind, value) pair")
        kind, value = entry
        current = getattr(env, name, None)
        if kind in _GENERATORS:
            if not isinstance(current, _GENERATORS[kind]):
                raise seed_codec.NotAState(f"its env state restores a {kind} {name!r}, which this env does not have")
            if kind == "torch.Generator":
                current.set_state(torch.from_numpy(_bytes(value)))
            elif kind == "numpy.Generator":
                current.bit_generator.state = value
            else:
                current.set_state(value)
        elif kind == "nested" and name in _NESTED and depth < 3 and hasattr(current, "__dict__"):
            restore_env_state(current, value, depth + 1)
        elif kind in ("value", "tensor") and name in own and not name.startswith("__"):
            if kind == "tensor":
                if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], np.ndarray)
                        and isinstance(value[1], str)):
                    raise seed_codec.NotAState(f"its env state's tensor {name!r} is not (array, device)")
                value = torch.from_numpy(value[0]).to(value[1])
            elif not (value is None or type(value) in (bool, int, float, str)):
                raise seed_codec.NotAState(f"its env state's value {name!r} is a {type(value).__name__}")
            if name in (getattr(env, "_buffers", None) or {}):
                env._buffers[name] = value
            else:
                object.__setattr__(env, name, value)
        else:
            raise seed_codec.NotAState(f"its env state sets {name!r} ({kind}), which topo never records for this env")


_GENERATORS = {"torch.Generator": torch.Generator, "numpy.Generator": np.random.Generator,
               "numpy.RandomState": np.random.RandomState}


def _bytes(value: Any) -> np.ndarray:
    if not (isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 1):
        raise seed_codec.NotAState("a torch generator state that is not a byte array")
    return value


def restore_seed_state(env: Any, state: dict[str, Any]) -> None:
    """Put a :func:`seed_state` (:func:`decode_seed_state`) back: the global RNGs and ``env``'s own state, each
    that was recorded. A state that does not fit raises (NotAState, or torch's, numpy's or random's error)."""
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "random" in state:
        random.setstate(state["random"])
    if "env" in state:
        restore_env_state(env, state["env"])


def digest(td: TensorDictBase) -> int:
    """A 64-bit digest of every leaf of ``td`` (tensors by their bytes, strings by their text), keys in order."""
    h = hashlib.blake2b(digest_size=8)
    for key in sorted(td.keys(True, True), key=str):
        if key == KEY:
            continue
        value = td.get(key)
        h.update(str(key).encode())
        if isinstance(value, torch.Tensor):
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
        else:
            h.update(repr(getattr(value, "data", value)).encode())
    return int.from_bytes(h.digest(), "little", signed=True)


def _ids(value: int, shape=()) -> torch.Tensor:
    """The id as every step of an episode carries it (one tensor, set on each step: no copy per step)."""
    return torch.full(tuple(shape), value, dtype=torch.int64)


def _scalar(value: Any) -> Any:
    return value.reshape(-1)[0] if isinstance(value, torch.Tensor) else value


def _optional(td: TensorDictBase, key: str) -> int | None:
    value = td.get(key, None)
    return None if value is None else int(_scalar(value))


def _instruction(td: TensorDictBase) -> str | None:
    value = td.get("language_instruction", None)
    if value is None:
        return None
    value = getattr(value, "data", value)
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, str) else None


def _init_state(env: Any) -> int | None:
    value = getattr(env, "topo_init_state", None)
    if value is None:
        value = getattr(env, "_current_init_state_index", None)
    return None if value is None else int(value)


def _name(key: Any) -> str:
    return ".".join(key) if isinstance(key, tuple) else str(key)
