"""The async engine (``collector.mode: async``): one torchrl ``AsyncBatchedCollector`` over every plan row.

Design: **one collector for the whole topology, its inference server a process of its own.** Subcollectors
exist in multi mode to bound a barrier (each ``ParallelEnv`` step waits for its slowest env) and to give a
policy copy a process; async mode has no barrier to bound, and one server batches whatever any env has
ready, so a collector per subcollector would only split the server's batches and add a driver per
subcollector. The plan's subcollectors stay in every row (records, blame, the first-batch check and the
report name them as in multi mode). The server is torchrl's ``ProcessInferenceServer``, started by this
process: the env workers reach it through shared-memory slots (:mod:`.transport`), so the trainer receives
finished transitions and never relays a request, and a GPU policy sits on its device once, away from the
trainer's training step. Nothing a worker shares with the server or the trainer is a lock or a descriptor it
could stop or die holding (:mod:`.transport`, :mod:`.channels`): a stopped worker blocks itself only, and is
named as hung and restarted as a dead one is.

Every env worker runs :func:`topo.launch.async_mode.slots.make_env` (:func:`topo.worker.make_env` plus the
instruction as bytes) over its row's kwargs: ``create_env_kwargs`` per worker, one module-level factory.
The slot layouts come from the backend's declared layout (:mod:`.slots`): no env is built in this
process. Workers start as the plan says (``start_methods.workers``): from a forkserver by default, which imports
the plan's ``launch.preload`` and the async worker's loop once (:func:`worker_context`), ended with the run (the
trainer SIGKILLed: at the end of its pipe); ``spawn`` where the plan says so.

The trainer's weights reach the server through torchrl's own path (``update_policy_weights_``: the server applies
them between forwards and bumps its version, stamped on every step it serves): :class:`ServedPlacement`. An eval
section runs as in multi mode (its own sync collector). A dead or hung env worker, or one past a health budget,
starts again from its rows (:mod:`.respawn`: its subcollector's rows, in the server's same slots). What it
cannot do (a policy anywhere but its server) is refused at validate (:mod:`topo.compiler.rules.async_mode`). Under
``placement.engine: ray`` each node's actor runs this engine over its rows (:mod:`topo.launch.ray.async_nodes`).
"""
from __future__ import annotations

import functools
import multiprocessing
import time
from typing import Any, Callable

from topo.runtime import episodes, heartbeat
from topo.backends import BatchKeys, get_backend
from topo.errors import UsageError
from topo.runtime.rundir import RunDir
from topo.launch import boundary, episode_versions, forkserver, observe
from topo.launch.async_mode import respawn, slots
from topo.launch.policy import Placement


class AsyncEngine:
    """``AsyncBatchedCollector`` over the plan's rows, on this machine; ``policy_setup`` is set by the run."""

    name = "async"
    capabilities: frozenset[str] = frozenset({"serves_policy", "weight_updates", "restarts"})
    weight_sync = None
    policy_setup = None  # topo.launch.policy.PolicySetup: the spec's policy, or the caller's factory over it
    respawner = None  # topo.launch.async_mode.respawn.Respawner, once built
    owns_forkserver = False  # this run started this process's forkserver (its env workers, its server)

    def check(self, plan: dict[str, Any]) -> None:
        """Nothing to reach."""

    def connect(self, plan: dict[str, Any]) -> None:
        """Nothing to join."""

    def disconnect(self) -> None:
        """Nothing to leave."""

    def set_eval_round(self, collector, number: int) -> None:
        """The eval process reads the run directory itself (its rows run in a sync collector of their own)."""

    def supervise(self, collector, port) -> None:
        """From now on the run's restart port decides when env workers start again (:mod:`.respawn`)."""
        self.respawner.supervise(port)

    def build(self, plan: dict[str, Any], **kwargs: Any):
        """The collector, its server and env workers started and every env built; ``kwargs`` are the caller's
        torchrl options (topo's ``pre_collect_hook`` is for subcollectors: its iterator stamps the batch owed here)."""
        from torchrl.modules.inference_server import InferenceDeviceConfig, InferenceServerConfig

        from topo.launch.async_mode.transport import SlotTransport

        setup, run = self.policy_setup, RunDir.current()
        rows = [row for sub in plan["subcollectors"] for row in sub["workers"]]
        self.owns_forkserver = plan["start_methods"]["workers"] != "spawn"
        layout = get_backend(plan["env"]["backend"]).layout(plan["env"]["kwargs"])
        request, response, instruction = slots.slot_layouts(layout, setup.factory, setup.kwargs,
                                                            plan["env"].get("transforms"))
        context = respawn.Context(worker_context(plan), len(rows),
                                  restarts=bool((plan["launch"].get("restarts") or {}).get("max")))
        if run is not None:
            for sub in plan["subcollectors"]:
                heartbeat.create(run.path, sub["index"], 0, sub["num_workers"])  # their memory and steps
        pre = kwargs.pop("pre_collect_hook", None)
        if getattr(pre, "keywords", {}).get("user_hook") is not None:
            raise UsageError("collector.mode async takes no pre_collect_hook: torchrl's AsyncBatchedCollector calls "
                             "none (use post_collect_hook, or collector.mode: multi)")
        hook = Observer(plan, run, kwargs.pop("post_collect_hook", None))
        collector = respawn.Supervised(
            [functools.partial(slots.make_env, instruction)] * len(rows),
            create_env_kwargs=[row["kwargs"] for row in rows],
            policy_factory=slots.server_factory(setup.factory, setup.kwargs, instruction),
            frames_per_batch=plan["collector"]["frames_per_batch"], total_frames=plan["collector"]["total_frames"],
            transport=SlotTransport(request, response, num_slots=len(rows), ctx=context.ctx),
            env_backend="multiprocessing",
            server_config=InferenceServerConfig(max_batch_size=len(rows)),
            device_config=InferenceDeviceConfig(policy_device=setup.device or "cpu"),
            transition_chunk_size=kwargs.pop("transition_chunk_size", _chunk(plan, len(rows))),
            post_collect_hook=hook, **kwargs)
        boundary.async_context(collector, context)  # the server took the plain one: its processes never restart
        boundary.start_async(collector)
        self.respawner = collector.respawner = respawn.Respawner(collector, context, plan, hook.restarted)
        if run is not None:
            _wait_built(run, len(rows))
        return collector

    def shutdown(self, collector, timeout: float) -> list[int | None]:
        """Stop the env workers (each closes its env) and the server within ``timeout``; no subcollector exits."""
        if self.respawner is not None:
            self.respawner.stop()
        collector.shutdown(timeout=timeout, raise_on_error=False)
        if self.owns_forkserver:
            forkserver.end()
        return []


class ServedPlacement(Placement):
    """The policy of an async run: the collector starts and shuts down its server (nothing to start or hand the
    collector here); :meth:`update` pushes the trainer's weights through it and returns the server's version."""

    def start_server(self, *args: Any, **kwargs: Any) -> None:
        """The engine starts the server with the collector (:func:`topo.launch.boundary.start_async`)."""

    def collector_kwargs(self, run: RunDir) -> dict[str, Any]:
        return {}

    def update(self, collector, policy_or_weights=None) -> int:
        """The weights to the server (before its start: applied before its first forward), under the served
        module's ``policy`` (:class:`~topo.launch.async_mode.slots.Instructed`); blocks until it applied them."""
        from tensordict import TensorDict

        started = time.perf_counter()
        collector.update_policy_weights_(TensorDict({"policy": self._weights(policy_or_weights)}, batch_size=[]))
        self.updates.append(time.perf_counter() - started)
        return self.version

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "placement": "server", "weight_sync": "server", "transport": "slots"}


ASYNC_PRELOAD = ["torchrl.collectors", "topo.launch.async_mode.slots"]  # the worker's loop and env factory


def worker_context(plan: dict[str, Any]):
    """The context the env workers (and the server) start with: ``spawn`` where the plan says so, else a forkserver
    of this run's own (``fork`` too: forking the trainer would copy its threads' locks mid-hold), preloading the
    plan's ``launch.preload`` (none of it makes a GL or CUDA context: :func:`topo.compiler.plan.preload_modules`)
    and the async worker's modules. One this process ran already (another run's, the user's) is ended first:
    a forkserver's preload is fixed when it starts."""
    if plan["start_methods"]["workers"] == "spawn":
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    forkserver.end()
    ctx.set_forkserver_preload(list(plan["launch"].get("preload") or []) + ASYNC_PRELOAD)
    return ctx


def _chunk(plan: dict[str, Any], workers: int) -> int:
    """Transitions per worker message: a batch's share of one worker, at most torchrl's 64 (its ``auto`` takes
    at least 64, and then a small batch holds the steps of one worker only)."""
    return max(1, min(64, plan["collector"]["frames_per_batch"] // workers))


def _wait_built(run: RunDir, n: int) -> None:
    """Until ``n`` envs are built; a failure meanwhile reaches this thread from the monitor (SIGINT)."""
    while sum(1 for m in run.read_all("markers") if m["name"] == "constructed") < n:
        time.sleep(0.05)


class Observer:
    """topo's ``post_collect_hook`` in async mode, in the trainer: each batch's steps split by the plan row that
    took them (``env_index`` is the row's place in the plan) and the worker life they come from (their episode
    ids say; :meth:`restarted` tells it otherwise), each subcollector life's ``observed/`` record written as a
    subcollector of multi mode writes it (:mod:`.observe`); then the user's hook."""

    def __init__(self, plan: dict[str, Any], run: RunDir | None, user_hook: Callable | None):
        self.rows = [(sub["index"], row["index"]) for sub in plan["subcollectors"] for row in sub["workers"]]
        self.width = {sub["index"]: sub["num_workers"] for sub in plan["subcollectors"]}
        self.lives = {sub["index"]: 0 for sub in plan["subcollectors"]}  # each subcollector's current life
        self.first: dict[tuple[int, int], list] = {}  # (subcollector, life) -> each worker's first steps seen
        self.batches: dict[tuple[int, int], int] = {}
        self.first_time: dict[tuple[int, int], float] = {}
        self.run, self.user_hook = run, user_hook
        try:
            self.keys = get_backend(plan["env"]["backend"]).batch_keys
        except LookupError:
            self.keys = BatchKeys()

    def __call__(self, batch) -> None:
        if self.run is not None:
            self.record(batch)
        if self.user_hook is not None:
            self.user_hook(batch)

    def restarted(self, c: int, life: int) -> None:
        """Subcollector ``c``'s workers started again, in worker life ``life``."""
        self.lives[c] = life

    def record(self, batch) -> None:
        flat = batch.reshape(-1)
        where = [self.rows[i] for i in flat.get(boundary.env_index_key()).reshape(-1).tolist()]
        ids = flat.get(episodes.KEY, None)
        lives = ((ids.reshape(-1) >> episodes.LIFE_SHIFT) & ((1 << episodes.LIFE_BITS) - 1)).tolist() \
            if ids is not None else [self.lives[c] for c, _ in where]
        for c, k in sorted({(c, k) for (c, _), k in zip(where, lives)}):
            mine = [i for i, ((s, _), life) in enumerate(zip(where, lives)) if (s, life) == (c, k)]
            self.batches[c, k] = self.batches.get((c, k), 0) + 1
            first = self.first.setdefault((c, k), [None] * self.width[c])
            for w in sorted({where[i][1] for i in mine}):
                if first[w] is None:
                    first[w] = observe.worker_seen(flat[[i for i in mine if where[i][1] == w]], self.keys)
            self.first_time.setdefault((c, k), time.time())
            episode_versions.record(self.run.path, c, k, self.batches[c, k], flat[mine])
            versions = flat[mine].get(slots.VERSION_KEY, None)
            self.run.put("observed", f"sub{c}" + (f".r{k}" if k else ""), subcollector=c, restart=k,
                         batches=self.batches[c, k], first=[seen or {} for seen in first],
                         first_time=self.first_time[c, k],
                         policy_versions=None if versions is None else sorted({int(v) for v in versions.tolist()}))
