"""The shared-memory slots of ``collector.mode: async``: their layouts from what the backend declares, and the
two ends that make an instruction (a string) cross them as bytes.

torchrl's ``ProcessSlotTransport`` holds tensors only, in fixed request and response layouts that its
``transport="auto"`` learns by building an env in the trainer. Here the request is the policy's in_keys
taken from the backend's :class:`~topo.backends.base.Layout` (no env built anywhere but in its worker),
the response one forward of the policy on that request (built once in the trainer on the CPU, as torchrl's
own ``auto`` does). An env worker writes its instruction's utf-8 bytes under :data:`INSTRUCTION_KEY`
(:func:`make_env`); the served policy reads them back as strings (:func:`served`).

The env workers and the server freeze the garbage collector once built: the interpreter's last collection
at exit walked every torch object they had imported, 10-15 s per process on this machine (torchrl's own
workers alike); frozen objects are skipped, and what the step loop allocates is still collected.
"""
from __future__ import annotations

import functools
import gc
import traceback
from typing import Any, Callable

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from topo.backends.base import INSTRUCTION_BYTES, Layout
from topo.errors import UsageError
from topo.launch import policy as policies
from topo.launch.instruction_bytes import INSTRUCTION_KEY, decode, encode
from topo.runtime import heartbeat
from topo.runtime.rundir import RunDir
from topo.worker import make_env as make_worker_env

VERSION_KEY = policies.VERSION_KEY


_row: dict[str, Any] = {}  # this worker process's row (where it is in the plan), once its env is built


def make_env(instruction_key: str | None = None, **kwargs: Any):
    """The env factory of every async worker: :func:`topo.worker.make_env` over the row's kwargs; when the policy
    reads ``instruction_key``, its reset and step results carry that instruction as bytes too (instance
    attributes, no subclass: what the worker records and stamps is untouched). Module level: picklable."""
    heartbeat.inference_in_worker()  # this worker's loop waits for the server between its steps: timed
    env = make_worker_env(**kwargs)
    _row.update(kwargs.get("worker") or {})
    gc.freeze()  # see the module's docstring
    reset, step = _reporting(env.reset, kwargs), _reporting(env.step_and_maybe_reset, kwargs)
    if instruction_key is None:
        env.reset, env.step_and_maybe_reset = reset, step
        return env
    key = instruction_key

    def with_bytes(td: TensorDictBase) -> TensorDictBase:
        td.set(INSTRUCTION_KEY, encode(td.get(key, None)))
        return td

    env.reset = lambda *args, **kw: with_bytes(reset(*args, **kw))
    env.step_and_maybe_reset = lambda *args, **kw: (lambda out: (out[0], with_bytes(out[1])))(step(*args, **kw))
    return env


def _reporting(call: Callable, kwargs: dict) -> Callable:
    """``call``, writing a ``failed`` marker with its traceback for the worker's row when it raises: torchrl's
    env loop only queues the error and waits, and its shutdown then ends every worker with exit code 0."""
    def reporting(*args: Any, **kw: Any) -> Any:
        try:
            return call(*args, **kw)
        except Exception:
            failed(traceback.format_exc())
            raise

    return reporting


def failed(text: str) -> None:
    """In an async worker whose loop raised: its ``failed`` marker with ``text``, once (the env's own error is
    recorded where it is raised, before torchrl's loop reports it)."""
    run = RunDir.current()
    if run is not None and _row and not _row.get("failed"):
        run.marker("failed", worker={k: v for k, v in _row.items() if k != "failed"}, traceback=text)
        _row["failed"] = True


class Instructed(TensorDictModuleBase):
    """The served policy: the request's instruction bytes back to ``instruction_key`` strings, then the policy."""

    def __init__(self, policy: TensorDictModuleBase, instruction_key: str | None):
        super().__init__()
        self.policy, self.instruction_key = policy, instruction_key
        self.in_keys = list(policy.in_keys)
        self.out_keys = list(policy.out_keys)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.instruction_key is not None and INSTRUCTION_KEY in tensordict.keys(True):
            words = decode(tensordict.get(INSTRUCTION_KEY))
            tensordict.set(self.instruction_key, NonTensorStack.from_list(words).reshape(tensordict.batch_size))
        out = self.policy(tensordict)
        return tensordict if out is None else out


def served(factory: str | Callable, kwargs: dict, instruction_key: str | None) -> Instructed:
    """In the server process: the policy (its ``server`` marker written: :func:`topo.launch.policy.in_server`)."""
    policy = Instructed(policies.in_server(factory, kwargs), instruction_key)
    gc.freeze()  # see the module's docstring
    return policy



def slot_layouts(layout: Layout, factory: str | Callable, kwargs: dict,
                 transforms: list[dict] | None = None) -> tuple[TensorDict, TensorDict, str | None]:
    """The request and response of one env (no batch dim), and the instruction key the policy reads (or None).

    Raises :class:`UsageError` naming the factory when the policy declares no in_keys/out_keys, reads
    a key the backend does not declare, or writes an action the envs under ``transforms`` do not take
    (:func:`action_slot`); runs before any worker starts."""
    name = factory if isinstance(factory, str) else getattr(factory, "__qualname__", repr(factory))
    policy = policies.build(factory, kwargs)
    if not getattr(policy, "in_keys", None) or not getattr(policy, "out_keys", None):
        raise UsageError(f"policy factory {name} made a policy without in_keys/out_keys: async mode sizes its slots "
                         "from them; wrap it in tensordict.nn.TensorDictModule(module, in_keys=..., out_keys=...)")
    request, instruction = TensorDict(), None
    for key in policy.in_keys:
        dotted = key if isinstance(key, str) else ".".join(key)
        if layout.instruction is not None and dotted == layout.instruction:
            instruction = layout.instruction
            request.set(INSTRUCTION_KEY, torch.zeros(INSTRUCTION_BYTES, dtype=torch.uint8))
            continue
        found = {k: v for k, v in layout.observation.items() if k == dotted or k.startswith(dotted + ".")}
        if not found:
            raise UsageError(f"policy factory {name} reads {dotted!r}, which the backend's declared layout does not "
                             f"hold (it declares {', '.join(layout.observation)}"
                             f"{', ' + layout.instruction if layout.instruction else ''})")
        for k, (shape, dtype) in found.items():
            request.set(tuple(k.split(".")), torch.zeros(shape, dtype=getattr(torch, dtype)))
    probe = Instructed(policy, instruction)
    with torch.no_grad():
        output = probe(request.clone().unsqueeze(0))
    response = output.select(*policy.out_keys).squeeze(0).cpu()
    action_slot(layout, transforms, response, name)
    response.set(VERSION_KEY, torch.zeros((), dtype=torch.long))
    return request, response, instruction


def action_slot(layout: Layout, transforms: list[dict] | None, response: TensorDict, name: str) -> None:
    """Check the response's action against what the workers' envs take, before any worker starts: the backend's
    declared action, or under ``MultiAction`` a chunk of it (``[N, *action]`` at the key it reads: ``chunk_key``,
    ``("vla_action", "chunk")`` for ``MultiAction.from_vla``). Raises :class:`UsageError` naming the policy
    factory; a stack of ``module:callable`` items is not known here (their envs' own errors name them)."""
    items = transforms or []
    if any(":" in item["name"] for item in items):
        return
    multi = next((item for item in items if item["name"].split(".")[0] == "MultiAction"), None)
    for key, (shape, _) in layout.action.items():
        want, read = tuple(shape), tuple(key.split("."))
        if multi is not None:
            kwargs = multi.get("kwargs") or {}
            chunk = kwargs.get("chunk_key") or (("vla_action", "chunk") if multi["name"].endswith(".from_vla")
                                                 else kwargs.get("action_key") or key)
            read = tuple(chunk.split(".")) if isinstance(chunk, str) else tuple(chunk)
        value = response.get(read, None)
        got = None if value is None else tuple(value.shape)
        ok = got is not None and (got[1:] == want and len(got) == len(want) + 1 if multi is not None else got == want)
        if not ok:
            what = f"a chunk [N, {', '.join(map(str, want))}] at {'.'.join(read)} (MultiAction in env.transforms)" \
                if multi is not None else f"{list(want)} at {'.'.join(read)}"
            raise UsageError(f"policy factory {name} writes {'no ' + '.'.join(read) if got is None else list(got)}: "
                             f"the envs take {what}; async mode's action slot is the policy's output (give the "
                             "policy a chunk of N actions with MultiAction, one action without it)")


def server_factory(factory: str | Callable, kwargs: dict, instruction_key: str | None) -> functools.partial:
    """The picklable factory the server process calls."""
    return functools.partial(served, factory, kwargs, instruction_key)
