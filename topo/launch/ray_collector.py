"""The Ray engine: torchrl's ``RayCollector``, one remote collector (a Ray actor) per subcollector.

Each actor runs a single ``Collector`` over the same worker-metadata ``ParallelEnv`` a local
subcollector builds (:func:`topo.launch.local.subcollector_env`): the actor builds no env, its env
workers are processes it spawns. :meth:`RayEngine.check` imports no torch (the CLI runs it before
anything starts); :meth:`RayEngine.build` and :meth:`RayEngine.shutdown` run in the trainer.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import os
import socket
import time
from typing import Any, Iterator

from .. import gl
from ..errors import LaunchError
from ..episodes import RECORD_VAR
from ..rundir import RUN_DIR_VAR, SLOTS_VAR
from . import plans

CONNECT_TIMEOUT_S = 5.0
HINT = ("start a cluster with `ray start --head` (other nodes join with `ray start --address=HEAD:6379`), "
        "or set placement.address")


def check_reachable(placement: dict[str, Any]) -> None:
    """Raise :class:`LaunchError` if ray is not installed, or a ``host:port`` address refuses a TCP connection."""
    if importlib.util.find_spec("ray") is None:
        raise LaunchError("placement engine 'ray' needs ray on this machine: pip install 'topo[ray]'")
    address = placement["address"]
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not (host and port.isdigit()):
        return  # e.g. 'auto': ray.init resolves it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise LaunchError(f"no Ray cluster at {address} ({err}): {HINT}") from None


def runtime_env(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan's runtime_env, plus topo's package (so actors run this topo) and the ``TOPO_*`` env vars.

    Actors hold GL off as the collector process does (:mod:`topo.gl`): ``MUJOCO_GL`` from the
    runtime_env, else this process's, is what their env workers get back.
    ``TOPO_RUN_DIR`` reaches the actors and, inherited, their env workers: their markers land in the
    run directory when it is on a filesystem they share with this machine. It is made absolute: an
    actor's working directory is Ray's, not this process's.
    """
    env = copy.deepcopy(plan["placement"]["runtime_env"])
    ours = {var: os.environ[var] for var in (RUN_DIR_VAR, SLOTS_VAR, RECORD_VAR) if os.environ.get(var)}
    if RUN_DIR_VAR in ours:
        ours[RUN_DIR_VAR] = os.path.abspath(ours[RUN_DIR_VAR])
    given = env.get("env_vars", {})
    ours.update(gl.held_env(given.get("MUJOCO_GL", gl.users_setting())))  # actors import torchrl with GL held
    env["env_vars"] = {**given, **ours}
    package = os.path.dirname(importlib.util.find_spec("topo").origin)
    env["py_modules"] = [*env.get("py_modules", []), package]
    return env


class RayTopology:
    """A ``RayCollector`` iterated up to the plan's ``total_frames`` (-1: no end), with what topo learnt of its actors.

    torchrl's ``RayCollector`` yields nothing for ``total_frames=-1`` and, when it reaches its
    total, kills its actors before their envs close: it gets no total, and this stops instead.
    ``actor_placement``: per subcollector, the node planned and the node its actor reports (:mod:`.ray_placement`);
    ``puller``: brings per-node records to the trainer (:mod:`.ray_records`), None with a shared run directory.
    """

    def __init__(self, collector, total_frames: int, plan_rows: list[list[dict]]):
        self.collector = collector
        self.total_frames = total_frames
        self.plan_rows = plan_rows  # each subcollector's worker rows
        self.actor_placement: list[dict] | None = None
        self.puller = None
        self.scheme = None  # the Ray weight-sync scheme, when the trainer pushes weights

    def __iter__(self) -> Iterator[Any]:
        from ray.exceptions import RayActorError

        frames = 0
        batches = iter(self.collector)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except RayActorError as err:
                raise self.lost(err) from None
            yield batch
            frames += batch.numel()
            if 0 < self.total_frames <= frames:
                return

    def lost(self, err: BaseException) -> BaseException:
        """Ray's error for a dead actor as topo's: the subcollector, its node and its plan rows.

        Ray names the actor (``actor_id``); any other error (gloo's, when a weight update meets a dead peer) is
        about a dead actor when one no longer answers; else it is returned as it was.
        """
        from ray.exceptions import RayActorError

        actors = list(self.collector.remote_collectors)
        ids = [actor._actor_id.hex() for actor in actors]
        index = ids.index(err.actor_id) if getattr(err, "actor_id", None) in ids else _first_dead(actors)
        if index is None:
            return LaunchError(f"a Ray actor of this run died: {_reason(err)}") if isinstance(err, RayActorError) else err
        node = (self.actor_placement or [{}] * len(ids))[index].get("actual") or {}
        rows = [row["global_index"] for row in self.plan_rows[index]]
        where = f" on {node['hostname']} (node {node['node_id'][:12]})" if node else ""
        return LaunchError(f"subcollector {index}'s Ray actor died{where}, with env workers {rows} (global indices): "
                           f"{_reason(err)}", subcollector=index)

    def update_policy_weights_(self, policy) -> None:
        """Every actor applies ``policy``'s weights (its ``version`` buffer with them) before this returns."""
        try:
            self.collector.update_policy_weights_(policy)
        except Exception as err:  # noqa: BLE001 - Ray's or gloo's: named when an actor died
            found = self.lost(err)
            if found is err:
                raise
            raise found from None


def _first_dead(actors: list, timeout: float = 10.0) -> int | None:
    """The index of the first actor that no longer answers (None: all do)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    for index, actor in enumerate(actors):
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout)
        except RayActorError:
            return index
        except GetTimeoutError:
            continue
    return None


def _reason(err: BaseException) -> str:
    return ((getattr(err, "error_msg", None) or str(err)).strip().splitlines() or [type(err).__name__])[0]


class RayEngine:
    """The plan's subcollectors as Ray actors, reached through the cluster at ``placement.address``.

    ``weight_updates``: the trainer's weights reach every actor through torchrl's ``RayWeightSyncScheme``.
    No ``restarts``: Ray restarts actors itself, topo does not restart them with their plan rows.
    """

    name = "ray"
    capabilities: frozenset[str] = frozenset({"weight_updates"})

    def check(self, plan: dict[str, Any]) -> None:
        check_reachable(plan["placement"])

    def build(self, plan: dict[str, Any], **kwargs: Any) -> RayTopology:
        """Connect to the plan's cluster, then a ``RayCollector`` whose actors hold their resources and built envs,
        the trainer's weights, and stand where the plan put them (else a LaunchError naming the subcollector).

        ``ray.init`` runs here, not in ``RayCollector``, so that a failure names the address; the actors'
        envs are built when this returns (RayCollector waits on every actor before it returns).
        Sync: each actor collects ``frames_per_batch / subcollectors`` frames and the batch stacks them;
        async: each batch is one actor's ``frames_per_batch``, as with the local multi collectors.
        Whatever fails here ends what it started: the actors and the driver's connection.
        """
        import ray

        placement = plan["placement"]
        deadline = time.monotonic() + plan["launch"]["startup_timeout"]
        try:
            ray.init(address=placement["address"], runtime_env=runtime_env(plan), log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            reason = str(err).rstrip(".")
            raise LaunchError(f"cannot connect to the Ray cluster at {placement['address']!r}: {reason}; {HINT}") from None
        topology = None
        try:
            topology = self._collector(plan, kwargs)
            self._ready(plan, topology, deadline)
        except BaseException:
            if topology is not None:
                self.shutdown(topology, plans.shutdown_budget(plan))
            else:
                ray.shutdown()  # the job ends: Ray ends the actors it had started
            raise
        return topology

    def _collector(self, plan: dict[str, Any], kwargs: dict[str, Any]) -> RayTopology:
        """The ``RayCollector``: one :class:`~.ray_node.NodeCollector` actor per subcollector.

        The policy arguments a run gives (:meth:`~.policy.Placement.collector_kwargs`: ``policy_factory``,
        the trainer's ``policy`` and a local weight-sync scheme) become: each actor builds its copy with the
        factory, and a ``RayWeightSyncScheme`` whose source is the trainer's ``policy`` carries the weights.
        ``policy`` is not passed on: RayCollector would pickle it to the actors instead of calling the
        factory there, and a scheme without a source calls the factory in the trainer.
        """
        from torchrl.collectors.distributed import RayCollector

        from .local import env_factories
        from .ray_node import NodeCollector

        placement = plan["placement"]
        source = kwargs.pop("policy", None)
        scheme = None
        if kwargs.pop("weight_sync_schemes", None) is not None and source is not None:
            from torchrl.weight_update import RayWeightSyncScheme

            scheme = RayWeightSyncScheme()
            scheme.model = source  # a weak reference: the run's Placement holds the source
        base = kwargs.pop("collector_kwargs", None) or {}
        run_dir = os.path.abspath(os.environ[RUN_DIR_VAR])
        collector_kwargs = [{**base, "topo_records": {"run_dir": run_dir, "mode": placement.get("run_dir", "per_node"),
                                                      "subcollector": c}}
                            for c in range(len(placement["subcollectors"]))]
        collector = RayCollector(
            env_factories(plan),
            frames_per_batch=plan["collector"]["frames_per_batch"],
            total_frames=math.inf,
            sync=plan["collector"]["sync"],
            collector_class=NodeCollector,  # one env per actor: its ParallelEnv (no extra process layer)
            collector_kwargs=collector_kwargs,
            remote_configs=[sub["remote_config"] for sub in placement["subcollectors"]],
            weight_sync_schemes={"policy": scheme} if scheme is not None else None,
            **kwargs,
        )
        topology = RayTopology(collector, plan["collector"]["total_frames"],
                               [sub["workers"] for sub in plan["subcollectors"]])
        topology.scheme = scheme
        return topology

    def _ready(self, plan: dict[str, Any], topology: RayTopology, deadline: float) -> None:
        """The actors' weights, nodes and records, before the first batch: the copies start with the trainer's
        weights (as on one machine), each actor says where it runs and the placement is checked; per node,
        the records written so far come to the trainer, then every :data:`~.ray_records.PULL_EVERY_S` seconds."""
        import ray

        from . import ray_placement
        from .ray_records import NodePuller

        collector = topology.collector
        if topology.scheme is not None:
            collector.update_policy_weights_(topology.scheme.model)
        actors = list(collector.remote_collectors)
        nodes = ray.get([actor.topo_node.remote() for actor in actors], timeout=max(1.0, deadline - time.monotonic()))
        totals = {node["NodeID"]: node.get("Resources", {}) for node in ray.nodes()}
        topology.actor_placement = ray_placement.compare(plan, nodes, totals)
        if plan["placement"].get("run_dir", "per_node") == "per_node":
            topology.puller = NodePuller(os.environ[RUN_DIR_VAR], actors, [node["node_id"] for node in nodes])
            topology.puller.pull(timeout=max(1.0, deadline - time.monotonic()))
            topology.puller.start()
        ray_placement.verify(topology.actor_placement)

    def supervise(self, topology: RayTopology, recovery) -> None:
        """Nothing: Ray restarts actors itself (``launch.restarts`` and ``hang_timeout`` need the local engine)."""

    def shutdown(self, topology: RayTopology, timeout: float) -> list[None]:
        """Close every actor's env, bring their nodes' last records, then end the actors and disconnect, within
        ``timeout`` seconds overall.

        ``RayCollector.shutdown`` only kills the actors (no env ``close()`` would run): each actor's own
        collector shuts down first. Actors have no exit code: one ``None`` per subcollector.
        """
        import ray

        deadline = time.monotonic() + timeout
        if topology.puller is not None:
            topology.puller.stop()
        actors = list(topology.collector.remote_collectors)
        closing = [actor.cascade_execute.remote("shutdown", raise_on_error=False) for actor in actors]
        ray.wait(closing, num_returns=len(closing), timeout=timeout)
        if topology.puller is not None:
            topology.puller.pull(timeout=max(1.0, (deadline - time.monotonic()) / 2), remove=True)
        topology.collector.shutdown(timeout=max(0.0, deadline - time.monotonic()))
        ray.shutdown()
        return [None] * len(actors)
