"""Where the policy runs, and how the trainer's weights reach it.

Two placements (the spec's ``policy.placement``):

- ``subcollector``: each subcollector builds the policy from the factory. When the trainer passes its
  own policy, the copies are wrapped in :class:`VersionedPolicy` and weights move through a torchrl
  weight-sync scheme (``shared_mem`` or ``multiprocess``); the trainer's policy is given to the
  collector as ``policy=`` so that no scheme ever calls the factory in the trainer.
- ``server``: one torchrl inference server builds the policy on its device: a ``ProcessInferenceServer`` on
  this machine, or under Ray an actor placed by the plan's ``placement.server`` (:mod:`topo.launch.ray.server`); each
  subcollector gets a ``PolicyClientModule`` over its own client; weights go to the server. The server
  stamps ``policy_version`` itself. A request carries the policy's in_keys only and a reply its out_keys
  only: locally each tensor crosses in shared memory of its own (``benchmarks/server_cost.py``).

Either way every batch row carries ``policy_version``: the number of weight updates the acting weights
had received. The factories below run in the subcollectors and the server (module level: picklable).
"""
from __future__ import annotations

import copy
import functools
import os
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from topo.errors import UsageError
from topo.launch import seeding
from topo.launch.ray import RayServer, here, start_server
from topo.runtime.rundir import RunDir, record
from topo.runtime.builder import import_builder

PLACEMENTS = ("subcollector", "server")
WEIGHT_SYNC = ("shared_mem", "multiprocess")
VERSION_KEY = "policy_version"


@dataclass
class PolicySetup:
    """The policy of one run: the plan's ``policy`` section, with what the trainer passed over it."""

    factory: str | Callable | None
    kwargs: dict = field(default_factory=dict)
    placement: str = "subcollector"
    device: str | None = None
    weight_sync: str = "shared_mem"

    @classmethod
    def resolve(cls, section: dict | None, factory: str | Callable | None) -> PolicySetup | None:
        """The plan's section, its factory replaced by ``factory`` when given; None: random actions."""
        section = dict(section or {})
        if factory is not None:
            section["factory"] = factory
        if section.get("factory") is None:
            return None
        return cls(section["factory"], dict(section.get("kwargs") or {}), section.get("placement", "subcollector"),
                   section.get("device"), section.get("weight_sync", "shared_mem"))

    def describe(self) -> dict[str, Any]:
        factory = self.factory if isinstance(self.factory, str) else \
            f"{getattr(self.factory, '__module__', '?')}:{getattr(self.factory, '__qualname__', repr(self.factory))}"
        return {"factory": factory, "kwargs": self.kwargs, "placement": self.placement, "device": self.device,
                "weight_sync": self.weight_sync if self.placement == "subcollector" else "server"}


# -- in the subcollectors and the server ---------------------------------------------------------

class VersionedPolicy(TensorDictModuleBase):
    """The user's policy, stamping every output with the version of the weights it acted with.

    ``version`` is a buffer: a weight-sync scheme carries it with the parameters, so each batch shows
    which update its subcollector had applied.
    """

    def __init__(self, policy: TensorDictModuleBase):
        super().__init__()
        self.policy = policy
        self.register_buffer("version", torch.zeros((), dtype=torch.long))
        self.in_keys = list(policy.in_keys)
        self.out_keys = [*policy.out_keys, VERSION_KEY]

    def forward(self, tensordict):
        out = self.policy(tensordict)
        out = tensordict if out is None else out
        out.set(VERSION_KEY, self.version.expand(out.batch_size).clone())
        return out


def build(factory: str | Callable, kwargs: dict):
    """Call the factory (``"module:callable"`` or a callable) and check it made a TensorDict policy."""
    make = import_builder(factory) if isinstance(factory, str) else factory
    policy = make(**kwargs)
    if not isinstance(policy, TensorDictModuleBase):
        raise TypeError(f"the policy factory returned a {type(policy).__name__}, not a TensorDictModuleBase: wrap it "
                        "in tensordict.nn.TensorDictModule(module, in_keys=..., out_keys=...) (torchrl would otherwise "
                        "build an env to guess its keys)")
    return policy


def in_subcollector(factory: str | Callable, kwargs: dict, versioned_copy: bool, index: int):
    """The policy of subcollector ``index``: built here, reported in the run directory."""
    run = RunDir.current()
    try:
        policy = build(factory, kwargs)
    except BaseException:
        if run is not None:
            run.marker("policy-failed", role="subcollector", subcollector=index, traceback=traceback.format_exc())
        raise
    if run is not None:
        run.marker("policy", role="subcollector", subcollector=index)
    return VersionedPolicy(policy) if versioned_copy else policy


def _replies(policy, args, out):
    """The served policy's forward hook: its reply carries the out_keys only (the server adds ``policy_version``)."""
    return (args[0] if out is None else out).select(*policy.out_keys)


def _requests(client_, args):
    """A client's forward pre-hook: the request carries the in_keys only (torchrl's sends the whole tensordict)."""
    return (args[0].select(*client_.in_keys),)


def in_server(factory: str | Callable, kwargs: dict, notes=None, seed: int | None = None):
    """The served policy, built where the server runs: a process of this machine (its own process group: a
    Ctrl-C is the trainer's), or a Ray actor whose records go to the trainer through ``notes``, a Ray queue
    (its node may share no filesystem with the trainer: :mod:`topo.launch.ray.server`). ``seed`` seeds its global
    RNGs first (:mod:`.seeding`)."""
    if notes is None:
        os.setpgid(0, 0)
    seeding.seed_globals(seed)
    note = _server_notes(notes)
    try:
        policy = build(factory, kwargs)
    except BaseException:
        note("policy-failed", role="server", traceback=traceback.format_exc())
        raise
    note("server", role="server", in_keys=_keys(policy.in_keys), out_keys=_keys(policy.out_keys))
    policy.register_forward_hook(_replies)
    return policy


def _server_notes(notes) -> Callable[..., None]:
    """How the server records a marker: into the run directory, or onto the trainer's queue (a Ray actor)."""
    if notes is not None:
        return lambda name, **fields: notes.put(record(name, **fields, actor=here()))
    run = RunDir.current()
    return run.marker if run is not None else lambda name, **fields: None


def client(client_, in_keys: list, out_keys: list):
    """A subcollector's policy under ``placement: server``: a client of the server."""
    from torchrl.modules.inference_server import PolicyClientModule

    remote = PolicyClientModule(client_, in_keys=[_key(k) for k in in_keys], out_keys=[_key(k) for k in out_keys])
    remote.register_forward_pre_hook(_requests)
    return remote


def _keys(keys) -> list:
    return [k if isinstance(k, str) else list(k) for k in keys]


def _key(k):
    return k if isinstance(k, str) else tuple(k)


# -- in the trainer ------------------------------------------------------------------------------

class Placement:
    """Runs a :class:`PolicySetup` for one run: starts the server, hands the collector its policy
    arguments, pushes weights, shuts down."""

    def __init__(self, setup: PolicySetup, trainer_policy, n_subcollectors: int, collector_acks: bool = False,
                 weight_sync: str | None = None):
        self.setup = setup
        self.collector_acks = collector_acks  # the collector waits for acknowledgements (topo.launch.local.respawn)
        self.weight_sync = weight_sync  # the engine's scheme, reported instead of the spec's (ray)
        self.trainer_policy = trainer_policy
        self.n = n_subcollectors
        self.sender = None  # subcollector placement: a VersionedPolicy over a copy of the trainer's policy
        self.server = None
        self.transport = None
        self.scheme = None
        self.seed: int | None = None  # the server's global RNGs' (:mod:`.seeding`), set by the run
        self.served: dict | None = None  # the server's record: its keys (for the clients of restarts), pid, host
        self._new_client: Callable | None = None  # a new client of the server
        self.updates: list[float] = []  # seconds each weight update took

    @property
    def version(self) -> int:
        return len(self.updates)

    def check(self) -> None:
        """Refuse, before anything starts, a trainer policy that torchrl would have to build an env for."""
        if self.trainer_policy is None:
            return
        if not isinstance(self.trainer_policy, TensorDictModuleBase):
            raise UsageError(f"policy= must be a tensordict TensorDictModuleBase, got {type(self.trainer_policy).__name__}:"
                            " wrap it in tensordict.nn.TensorDictModule(module, in_keys=..., out_keys=...)")

    def start_server(self, startup_timeout: float, run: RunDir, actor: dict[str, Any] | None = None,
                     on_death: Callable | None = None) -> None:
        """``placement: server``: the inference server, built and ready (its factory ran where it runs): a process
        of this machine, or with ``actor`` (the plan's ``placement.server``) a Ray actor whose death is handed
        to ``on_death`` while the run collects (:mod:`topo.launch.ray.server`)."""
        if self.setup.placement != "server":
            return
        if actor is not None:
            served = functools.partial(in_server, self.setup.factory, self.setup.kwargs, seed=self.seed)
            self.server = start_server(served, self.setup.device, actor, startup_timeout, run, on_death)
            self.server.verify()
            self._new_client = self.server.client
        else:
            import multiprocessing

            from torchrl.modules.inference_server import MPTransport, ProcessInferenceServer

            ctx = multiprocessing.get_context("spawn")
            # manager-backed: a restarted subcollector's client, made after the server started, is registered there
            # (each request and reply then takes two more hops: benchmarks/server_cost.py)
            self.transport = MPTransport(ctx=ctx, use_manager=True)
            self._new_client = self.transport.client
            self.server = ProcessInferenceServer(
                policy_factory=functools.partial(in_server, self.setup.factory, self.setup.kwargs, seed=self.seed),
                transport=self.transport, policy_device=self.setup.device, mp_context=ctx,
                startup_timeout=max(1.0, startup_timeout))
            self.server.start()
        self._clients = [self._new_client() for _ in range(self.n)]

    def collector_kwargs(self, run: RunDir) -> dict[str, Any]:
        """``policy_factory`` (one per subcollector), ``policy`` and the weight-sync scheme, as the placement needs."""
        setup = self.setup
        if setup.placement == "server":
            self.served = next(r for r in run.read_all("markers") if r["name"] == "server")
            return {"policy_factory": [self._client_factory(self._clients[c]) for c in range(self.n)]}
        synced = self.trainer_policy is not None
        kwargs: dict[str, Any] = {"policy_factory": [
            functools.partial(in_subcollector, setup.factory, setup.kwargs, synced, c) for c in range(self.n)]}
        if setup.device is not None:
            kwargs["policy_device"] = setup.device
        if synced:
            from torchrl.weight_update import MultiProcessWeightSyncScheme, SharedMemWeightSyncScheme

            # the copies get their own buffer, not the trainer's parameters: torchrl's schemes move the module
            # they are given into shared memory, where the copies would see each optimizer step as it happens
            self.sender = VersionedPolicy(copy.deepcopy(self.trainer_policy))
            # collector_acks: the collector waits for each acknowledgement itself, restarting a lost
            # subcollector instead of waiting for it forever (topo.launch.local.respawn)
            sync = not self.collector_acks
            self.scheme = SharedMemWeightSyncScheme(sync=sync) if setup.weight_sync == "shared_mem" else \
                MultiProcessWeightSyncScheme(sync=sync)
            kwargs.update(policy=self.sender, weight_sync_schemes={"policy": self.scheme})
        return kwargs

    def _client_factory(self, client_) -> functools.partial:
        return functools.partial(client, client_, self.served["in_keys"], [*self.served["out_keys"], VERSION_KEY])

    def restart_factory(self, index: int) -> functools.partial | None:
        """The policy factory of a restarted subcollector: a new client of the server (the old one's may hold
        the answer to a request its process never read); None: the factory its first start had."""
        if self.setup.placement != "server":
            return None
        return self._client_factory(self._new_client())

    def update(self, collector, policy_or_weights=None) -> int:
        """Push the trainer's weights (or ``policy_or_weights``) to every copy; returns the new version."""
        started = time.perf_counter()
        if self.setup.placement == "server":
            self.server.update_model_weights(self._weights(policy_or_weights))
        elif self.sender is None:
            raise UsageError("weights cannot be updated: pass the trainer's policy to topo.collector(policy=...) so "
                            "that topo sets up a weight-sync scheme")
        else:
            with torch.no_grad():
                TensorDict.from_module(self.sender.policy).data.update_(self._weights(policy_or_weights))
                self.sender.version += 1
            collector.update_policy_weights_(self.sender)  # each copy applies them, and acknowledges
        self.updates.append(time.perf_counter() - started)
        return self.version

    def current_weights(self) -> bytes | None:
        """The trainer policy's weights now, serialised (what an eval round acts with); None without one."""
        if self.trainer_policy is None:
            return None
        import io

        buffer = io.BytesIO()
        torch.save(TensorDict.from_module(self.trainer_policy).data.detach().clone().cpu(), buffer)
        return buffer.getvalue()

    def _weights(self, policy_or_weights):
        source = self.trainer_policy if policy_or_weights is None else policy_or_weights
        if source is None:
            raise UsageError("no weights to push: pass policy= to topo.collector, or weights to update_weights()")
        if isinstance(source, TensorDictBase):
            return source.data
        return TensorDict.from_module(source).data

    def shutdown(self, timeout: float) -> None:
        """End the server and the scheme's queues and threads now: left to the garbage collector, torchrl's
        scheme starts a queue thread while the interpreter exits, and the trainer never exits."""
        if self.scheme is not None:
            self.scheme.shutdown()
        if self.server is not None:
            self.server.shutdown(timeout=timeout)
        if self.transport is not None:
            self.transport.close()

    def describe(self) -> dict[str, Any]:
        out = self.setup.describe()
        if self.weight_sync and self.setup.placement == "subcollector":
            out["weight_sync"] = self.weight_sync
        ups = self.updates
        if isinstance(self.server, RayServer):
            out["server"] = self.server.placement  # the actor's planned and actual node
        out.update(trainer_policy=self.trainer_policy is not None, updates=len(ups),
                   update_s=None if not ups else {"min": round(min(ups), 4), "mean": round(sum(ups) / len(ups), 4),
                                                   "max": round(max(ups), 4)})
        return out
