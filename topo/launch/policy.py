"""Where the policy runs, and how the trainer's weights reach it.

Two placements (the spec's ``policy.placement``):

- ``subcollector``: each subcollector builds the policy from the factory. When the trainer passes its
  own policy, the copies are wrapped in :class:`VersionedPolicy` and weights move through a torchrl
  weight-sync scheme (``shared_mem`` or ``multiprocess``); the trainer's policy is given to the
  collector as ``policy=`` so that no scheme ever calls the factory in the trainer.
- ``server``: one torchrl inference server builds the policy on its device: a ``ProcessInferenceServer`` on
  this machine, or under Ray an actor placed by the plan's ``placement.server`` (:mod:`topo.launch.ray.server`); each
  subcollector gets a ``PolicyClientModule`` over its own client; weights go to the server. The server
  stamps ``policy_version`` itself. Locally requests and replies cross in torchrl's ``ProcessSlotTransport``,
  one shared-memory slot per subcollector, laid out from the backend's declared observation and the policy's
  out_keys (:mod:`.server_slots`); where no layout is known before the start (a backend that declares none,
  subcollectors of unequal sizes) through torchrl's manager-backed queue, the policy's in_keys and out_keys
  only (``benchmarks/server_cost.py``).

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
from torch.nn.parameter import is_lazy
from tensordict.nn import TensorDictModuleBase

from topo.runtime import heartbeat
from topo.errors import UsageError
from topo import seeding
from topo.launch.ray import RayServer, here, start_server
from topo.runtime.rundir import RunDir, record
from topo.runtime.builder import import_builder
from topo.launch import server_slots

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
    return _timed(VersionedPolicy(policy) if versioned_copy else policy)


def _timed(module: TensorDictModuleBase) -> TensorDictModuleBase:
    """``module``, each of its calls timed into its subcollector's heartbeat slot (:mod:`topo.runtime.time_breakdown`):
    the first of its forward pre-hooks and the last of its forward hooks."""
    started: list[float] = []
    module.register_forward_pre_hook(lambda _, args: started.append(time.perf_counter()), prepend=True)
    module.register_forward_hook(lambda _, args, out: heartbeat.policy_call(time.perf_counter() - started.pop()))
    return module


def _replies(policy, args, out):
    """The served policy's forward hook: its reply carries the out_keys only (the server adds ``policy_version``)."""
    return (args[0] if out is None else out).select(*policy.out_keys)


def _requests(client_, args):
    """A client's forward pre-hook: the request carries the in_keys only (torchrl's sends the whole tensordict)."""
    return (args[0].select(*client_.in_keys),)


def in_server(factory: str | Callable, kwargs: dict, notes=None, slots: server_slots.Layout | None = None,
              device: str | None = None, seed: int | None = None):
    """The served policy, built where the server runs: a process of this machine (its own process group: a
    Ctrl-C is the trainer's), or a Ray actor whose records go to the trainer through ``notes``, a Ray queue
    (its node may share no filesystem with the trainer: :mod:`topo.launch.ray.server`). With ``slots`` (the
    transport's request layout) it decodes requests and packs replies; how they pack goes into its marker for the
    clients. ``seed`` seeds its global RNGs first (:mod:`.seeding`). On a CPU it computes on one thread, as a
    subcollector's copy does (torchrl's ``num_sub_threads``): the cores are the env workers'."""
    if notes is None:
        os.setpgid(0, 0)
    if not str(device or "cpu").startswith("cuda"):
        torch.set_num_threads(1)
    seeding.seed_globals(seed)
    note = _server_notes(notes)
    try:
        policy = build(factory, kwargs)
        packing = None if slots is None else _packing(policy, slots, device)
    except BaseException:
        note("policy-failed", role="server", traceback=traceback.format_exc())
        raise
    note("server", role="server", in_keys=_keys(policy.in_keys), out_keys=_keys(policy.out_keys), reply=packing)
    if packing is None:
        policy.register_forward_hook(_replies)
    else:
        policy.register_forward_pre_hook(functools.partial(_decoded, slots))
        policy.register_forward_hook(functools.partial(_packed, packing))
    return policy


def materialized(weights: TensorDictBase, module: Any) -> TensorDictBase:
    """``weights`` less the tensors of ``module``'s lazy layers not materialized yet (a trainer's before its first
    forward, TinyVLA's): they hold no value to push, and the served copy, materialized by its own first forward
    (:func:`_packing`'s), keeps its own, as the recipe's server does."""
    if not isinstance(module, torch.nn.Module):
        return weights
    lazy = [name for name, t in [*module.named_parameters(), *module.named_buffers()] if is_lazy(t)]
    if not lazy:
        return weights
    flat = weights.flatten_keys(".")
    return flat.exclude(*[name for name in lazy if name in flat.keys()]).unflatten_keys(".")


def _packing(policy, slots: server_slots.Layout, device: str | None) -> list:
    """How the policy's out_keys pack into a reply slot: its forward on one zero request of the slot layout."""
    missing = [k for k in policy.in_keys if (k,) not in slots.keys and k not in slots.keys]
    if missing:
        raise ValueError(f"the policy reads {_keys(missing)}, which the backend's declared observation "
                         f"({_keys(list(slots.keys))}) does not hold")
    if device is not None:
        policy.to(device)
    request = server_slots.decode_request(server_slots.request_spec(slots).unsqueeze(0), slots)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        out = policy(request.to(device) if device is not None else request)
    return server_slots.reply_layout(request if out is None else out, policy.out_keys)


def _decoded(slots, policy, args):
    """The served policy's forward pre-hook (slots): each string's bytes back to a string."""
    return (server_slots.decode_request(args[0].copy(), slots),)


def _packed(packing, policy, args, out):
    """The served policy's forward hook (slots): its out_keys packed into the reply slot's bytes."""
    return server_slots.pack(args[0] if out is None else out, packing)


def _server_notes(notes) -> Callable[..., None]:
    """How the server records a marker: into the run directory, or onto the trainer's queue (a Ray actor)."""
    if notes is not None:
        return lambda name, **fields: notes.put(record(name, **fields, actor=here()))
    run = RunDir.current()
    return run.marker if run is not None else lambda name, **fields: None


def client(client_, in_keys: list, out_keys: list, slots: server_slots.Layout | None = None,
           packing: list | None = None):
    """A subcollector's policy under ``placement: server``: a client of the server (with ``slots``, of its slot)."""
    from torchrl.modules.inference_server import PolicyClientModule

    if isinstance(client_, server_slots.Inherited):  # not pickled: called in the process that made it
        client_ = client_.obj
    remote = PolicyClientModule(client_, in_keys=[_key(k) for k in in_keys], out_keys=[_key(k) for k in out_keys])
    if slots is None:
        remote.register_forward_pre_hook(_requests)
    else:
        remote.register_forward_pre_hook(lambda module, args: (server_slots.encode(args[0], slots),))
        remote.register_forward_hook(lambda module, args, out: server_slots.unpack(out, packing))
    return _timed(remote)


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
        self.slots: server_slots.Layout | None = None  # the local server's slot layout (None: manager-backed queue)
        self.transport_why: str | None = None  # why the local server keeps the manager-backed queue
        self.updates: list[float] = []  # seconds each weight update took
        self.base_version = 0  # the version the run starts at (a resumed run's: the one it resumes had pushed)
        self.stats: dict | None = None  # the server's figures (torchrl's stats()) as last read

    @property
    def version(self) -> int:
        return self.base_version + len(self.updates)

    def check(self) -> None:
        """Refuse, before anything starts, a trainer policy that torchrl would have to build an env for."""
        if self.trainer_policy is None:
            return
        if not isinstance(self.trainer_policy, TensorDictModuleBase):
            raise UsageError(f"policy= must be a tensordict TensorDictModuleBase, got {type(self.trainer_policy).__name__}:"
                            " wrap it in tensordict.nn.TensorDictModule(module, in_keys=..., out_keys=...)")

    def start_server(self, startup_timeout: float, run: RunDir, actor: dict[str, Any] | None = None,
                     on_death: Callable | None = None, plan: dict[str, Any] | None = None) -> None:
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

            from torchrl.modules.inference_server import MPTransport, ProcessInferenceServer, ProcessSlotTransport

            ctx = multiprocessing.get_context("spawn")
            self.slots, self.transport_why = server_slots.layout(plan) if plan is not None else (None, "no plan")
            if self.slots is not None:
                # one shared-memory slot per subcollector; a restarted subcollector takes its predecessor's
                self.transport = ProcessSlotTransport(
                    server_slots.request_spec(self.slots), server_slots.response_spec(self.slots.workers),
                    num_slots=self.n, ctx=ctx, copy_result=False)
            else:
                # manager-backed: a restarted subcollector's client, made after the server started, is registered
                # there (each request and reply then takes two more hops: benchmarks/server_cost.py)
                self.transport = MPTransport(ctx=ctx, use_manager=True)
                self._new_client = self.transport.client
            self.server = ProcessInferenceServer(
                policy_factory=functools.partial(in_server, self.setup.factory, self.setup.kwargs, None, self.slots,
                                                 self.setup.device, seed=self.seed),
                transport=self.transport, policy_device=self.setup.device, mp_context=ctx,
                startup_timeout=max(1.0, startup_timeout))
            self.server.start()
            if self.slots is not None:
                self._clients = [server_slots.Inherited(self.transport.client()) for _ in range(self.n)]
                return
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
            self.sender.version.fill_(self.base_version)
            # collector_acks: the collector waits for each acknowledgement itself, restarting a lost
            # subcollector instead of waiting for it forever (topo.launch.local.respawn)
            sync = not self.collector_acks
            self.scheme = SharedMemWeightSyncScheme(sync=sync) if setup.weight_sync == "shared_mem" else \
                MultiProcessWeightSyncScheme(sync=sync)
            kwargs.update(policy=self.sender, weight_sync_schemes={"policy": self.scheme})
        return kwargs

    def _client_factory(self, client_) -> functools.partial:
        return functools.partial(client, client_, self.served["in_keys"], [*self.served["out_keys"], VERSION_KEY],
                                 self.slots, self.served.get("reply"))

    def restart_factory(self, index: int) -> functools.partial | None:
        """The policy factory of a restarted subcollector: a new client of the server (the old one's may hold
        the answer to a request its process never read), or with slots its predecessor's slot (a request that
        process left is answered long before the new one's first: it builds its envs first); None: the
        factory its first start had."""
        if self.setup.placement != "server":
            return None
        if self.slots is not None:
            return self._client_factory(self._clients[index])
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
        weights = source.data if isinstance(source, TensorDictBase) else TensorDict.from_module(source).data
        return materialized(weights, source if isinstance(source, torch.nn.Module) else self.trainer_policy)

    def server_stats(self, timeout: float = 1.0) -> dict | None:
        """The server's figures now (torchrl's ``stats()``: forward and queue p50/p95, requests per forward), or as
        last read once it is gone; None without a local server (a Ray server's are not read)."""
        if self.server is not None and not isinstance(self.server, RayServer):
            try:
                self.stats = dict(self.server.stats(timeout=timeout))
            except Exception:  # noqa: BLE001 - a server gone or not answering: the figures last read
                pass
        return self.stats

    def shutdown(self, timeout: float) -> None:
        """End the server and the scheme's queues and threads now: left to the garbage collector, torchrl's
        scheme starts a queue thread while the interpreter exits, and the trainer never exits."""
        if self.scheme is not None:
            self.scheme.shutdown()
        if self.server is not None:
            self.server_stats()  # for the report's time breakdown
            self.server.shutdown(timeout=timeout)
        if self.transport is not None and hasattr(self.transport, "close"):  # ProcessSlotTransport holds no manager
            self.transport.close()

    def describe(self) -> dict[str, Any]:
        out = self.setup.describe()
        if self.weight_sync and self.setup.placement == "subcollector":
            out["weight_sync"] = self.weight_sync
        ups = self.updates
        if isinstance(self.server, RayServer):
            out["server"] = self.server.placement  # the actor's planned and actual node
        elif self.server is not None:
            out["transport"] = "slots" if self.slots is not None else "manager"
            if self.slots is None:
                out["transport_why"] = self.transport_why
        out.update(trainer_policy=self.trainer_policy is not None, updates=len(ups),
                   update_s=None if not ups else {"min": round(min(ups), 4), "mean": round(sum(ups) / len(ups), 4),
                                                   "max": round(max(ups), 4)})
        return out
