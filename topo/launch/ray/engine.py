"""The Ray engine: torchrl's ``RayCollector``, one remote collector (a Ray actor) per subcollector.

Each actor runs a single ``Collector`` over the same worker-metadata ``ParallelEnv`` a local
subcollector builds (:func:`topo.launch.subcollector.subcollector_env`): the actor builds no env, its env
workers are processes it spawns. :meth:`RayEngine.check` imports no torch (the CLI runs it before
anything starts); :meth:`RayEngine.build` and :meth:`RayEngine.shutdown` run in the trainer.
"""
from __future__ import annotations

import copy
import importlib.util
import math
import os
import signal
import socket
import time
from typing import Any, Iterator

from topo.runtime import gl
from topo.errors import LaunchError
from topo.runtime.episodes import RECORD_VAR, RETAIN_VAR
from topo.runtime.rundir import RUN_DIR_VAR, SLOTS_VAR
from topo.launch.supervision import failure as failures, processes, teardown
from topo.launch.ray.auth import TOKEN_HINT, sends_token, token_required
from topo.launch.ray.placement import reason

CONNECT_TIMEOUT_S = 5.0
POLL_S = 0.5  # between looks at the run's verdicts while waiting on actors
END_S = 5.0  # for a replaced actor to end its env workers
ROUND_S = 30.0  # for every actor to write an eval round's number on its node
NODES_EVERY_S = 2.0  # while a restarted actor waits for its node: how often the cluster's nodes are read
HINT = ("start a cluster with `ray start --head` (other nodes join with `ray start --address=HEAD:6379`), "
        "or set placement.address")


def check_reachable(placement: dict[str, Any]) -> None:
    """Raise :class:`LaunchError` if ray is not installed, a ``host:port`` address refuses a TCP connection, or its
    cluster refuses a client without its token and this process would send none (Ray would retry for 20 s)."""
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
    if not sends_token() and token_required(address):
        raise LaunchError(f"the Ray cluster at {address} refuses a client without its token, and this process sends "
                          f"none: {TOKEN_HINT}")


def cannot_connect(address: str, err: BaseException) -> LaunchError:
    """What a failed ``ray.init`` at ``address`` says: Ray's reason, then how to give the token when the cluster
    refuses a client without one (Ray itself says only that it failed to connect), else how to start a cluster."""
    then = f"it refuses a client without its token: {TOKEN_HINT}" if token_required(address) else HINT
    return LaunchError(f"cannot connect to the Ray cluster at {address!r}: {reason(err).rstrip('.')}; {then}")


def runtime_env(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan's runtime_env, plus topo's package (so actors run this topo) and the ``TOPO_*`` env vars.

    Actors hold GL off as the collector process does (:mod:`topo.runtime.gl`): ``MUJOCO_GL`` from the
    runtime_env, else this process's, is what their env workers get back.
    ``TOPO_RUN_DIR`` reaches the actors and, inherited, their env workers: their markers land in the
    run directory when it is on a filesystem they share with this machine. It is made absolute: an
    actor's working directory is Ray's, not this process's.
    """
    env = copy.deepcopy(plan["placement"]["runtime_env"])
    ours = {var: os.environ[var] for var in (RUN_DIR_VAR, SLOTS_VAR, RECORD_VAR, RETAIN_VAR)
            if os.environ.get(var)}
    if RUN_DIR_VAR in ours:
        ours[RUN_DIR_VAR] = os.path.abspath(ours[RUN_DIR_VAR])
    given = env.get("env_vars", {})
    ours.update(gl.held_env(given.get("MUJOCO_GL", gl.users_setting())))  # actors import torchrl with GL held
    env["env_vars"] = {**given, **ours}
    package = os.path.dirname(importlib.util.find_spec("topo").origin)
    env["py_modules"] = [*env.get("py_modules", []), package]
    return env


class RayTopology:
    """The plan's actors iterated batch by batch up to ``total_frames`` (-1: no end), with what topo learnt of them.

    topo asks the actors for their rollouts itself (as torchrl's ``RayCollector`` does: sync, one rollout from
    every actor stacked; async, one actor's rollout at a time), so that a failed actor does not end the
    iteration: with the run's :class:`~.recovery.Recovery` (:meth:`RayEngine.supervise`), a subcollector whose
    actor or env worker died is judged by the run's monitor and, when restarted, its actor is made again with
    the same plan rows (:mod:`.restarts`) while the others keep collecting; the batch being gathered waits for
    it (sync) or loses its rollout in flight (async), as on one machine. A node that left the cluster is
    named with every actor it held.
    ``actor_placement``: per subcollector, the node planned and the node its actor reports (:mod:`.ray_placement`);
    ``puller``: brings per-node records to the trainer (:mod:`.ray_records`), None with a shared run directory.
    """

    def __init__(self, collector, plan: dict[str, Any]):
        self.collector = collector
        self.plan = plan
        self.total_frames = plan["collector"]["total_frames"]
        self.plan_rows = [sub["workers"] for sub in plan["subcollectors"]]  # each subcollector's worker rows
        self.actor_placement: list[dict] | None = None
        self.puller = None
        self.scheme = None  # the Ray weight-sync scheme, when the trainer pushes weights
        self.recovery = None  # the run's side of restarts (RayEngine.supervise)
        self.on_batch = None  # called with each batch before it is yielded (the run's digest: :mod:`.digest`)
        self.eval_round = 0  # the evaluation round as set last (an eval run's actors; negative: ended): a restarted actor's too

    @property
    def actors(self) -> list:
        return list(self.collector.remote_collectors)

    def __iter__(self) -> Iterator[Any]:
        frames = 0
        for batch in (self._sync() if self.plan["collector"]["sync"] else self._async()):
            if self.on_batch is not None:
                self.on_batch(batch)
            yield batch
            frames += batch.numel()
            if 0 < self.total_frames <= frames:
                return

    def _sync(self) -> Iterator[Any]:
        import ray
        import torch

        n = len(self.plan_rows)
        while True:
            asked = {c: self.actors[c].next.remote() for c in range(n)}
            got: dict[int, Any] = {}
            while len(got) < n:
                for c in self._decided():
                    self._restart(c)
                    if c not in got:
                        asked[c] = self.actors[c].next.remote()
                pending = {ref: c for c, ref in asked.items() if c not in got}
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
                for ref in ready:
                    c = pending[ref]
                    rollout = self._get(c, ref)
                    if rollout is None:
                        asked[c] = self.actors[c].next.remote()
                    else:
                        got[c] = rollout
            yield torch.stack([got[c] for c in range(n)])

    def _async(self) -> Iterator[Any]:
        import ray

        pending = {actor.next.remote(): c for c, actor in enumerate(self.actors)}
        while True:
            for c in self._decided():
                self._restart(c)
                pending = {ref: i for ref, i in pending.items() if i != c}
                pending[self.actors[c].next.remote()] = c
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if not ready:
                continue
            c = pending.pop(ready[0])
            rollout = self._get(c, ready[0])
            pending[self.actors[c].next.remote()] = c
            if rollout is not None:
                yield rollout

    def _get(self, c: int, ref) -> Any:
        """Subcollector ``c``'s rollout; None when its actor failed and was made again (ask it once more)."""
        import ray

        try:
            return ray.get(ref)
        except _ray_errors() as err:
            self._failed(c, err)
            self._restart(c)
            return None

    def _decided(self) -> list[int]:
        """The subcollectors whose restart the run decided meanwhile (the monitor saw a death); raises the run's
        failure, once there is one."""
        if self.recovery is None:
            return []
        self.recovery.tick()
        return [c for c in range(len(self.plan_rows)) if self.recovery.lost(c)]

    def _failed(self, c: int, err: BaseException) -> None:
        """Subcollector ``c``'s actor failed with Ray's ``err``: return once its restart is decided; raise the
        run's failure (naming the worker or actor, its plan rows, its node) otherwise."""
        if self.recovery is None:
            raise self.lost(err) from None
        self.recovery.judge(c, self._failure(c, err), first_records=False)

    def _failure(self, c: int, err: BaseException) -> failures.Failure:
        """What Ray's ``err`` says of subcollector ``c``: env workers that died (its actor saw them), its node
        lost, or its actor dead."""
        from topo.launch.ray.node import EnvWorkersDied

        now, blame = time.time(), self.recovery.blame
        node = self._node(c)
        cause = getattr(err, "cause", None)
        if isinstance(cause, EnvWorkersDied):
            index, pid, exitcode = min(cause.dead, key=lambda d: _likely_cause(d, cause.hung))
            return blame(lambda state: failures.remote_worker_died(
                state, c, index, pid, processes.describe_exitcode(exitcode), _where(node), node.get("hostname"), now,
                cause.hung.get(index)))
        if node and not _node_alive(node["node_id"]):
            if not _placeable(self.plan, c):
                return self._lost_node(c, node)
            return blame(lambda state: failures.actor_died(state, c, "its node left the cluster (another can hold it)",
                                                           _where(node), now))
        if not isinstance(err, _ray_errors()[0]):  # a RayTaskError: the actor raised, and is alive
            return blame(lambda state: failures.actor_failed(state, c, reason(cause or err), str(err).strip() or None,
                                                             _where(node), now))
        return blame(lambda state: failures.actor_died(state, c, reason(err), _where(node), now))

    def _node(self, c: int) -> dict:
        return ((self.actor_placement or [{}] * len(self.plan_rows))[c].get("actual")) or {}

    def _restart(self, c: int) -> None:
        """Make subcollector ``c``'s actor again, with its restart's rows, on a node its resources allow; it
        starts from the trainer's weights; the placement is checked again. An actor that fails meanwhile is
        judged as any failure (another restart, or the run's failure)."""
        import ray

        from topo.launch.ray import placement as ray_placement
        from topo.launch.subcollector import env_factory

        while True:
            start = self.recovery.begin(c)
            old = self.actors[c]
            if self.puller is not None:  # the new actor may land elsewhere: its node's records so far, through it
                self.puller.pull(timeout=END_S)
            _end(old)
            # the server's client of the old actor may hold the answer to a request it never read: a new one
            actor = self.collector.replace(c, env_factory(self.plan, c, start.rows), start.restart, start.policy_factory)
            try:
                node = self._wait(c, actor.topo_node.remote())
                if self.scheme is not None:
                    self.scheme = self.collector.resync(self.scheme.model, timeout=self.plan["launch"]["startup_timeout"])
            except _ray_errors() as err:
                self._failed(c, err)
                continue
            break
        if self.actor_placement is not None:
            totals = {n["NodeID"]: n.get("Resources", {}) for n in ray.nodes()}
            row = ray_placement.compare({"placement": {"subcollectors": [self.plan["placement"]["subcollectors"][c]]}},
                                        [node], totals)[0]
            self.actor_placement[c] = {**row, "subcollector": c, "restart": start.restart}
            ray_placement.verify([self.actor_placement[c]])
        if self.puller is not None:
            self.puller.replace(old, actor, node["node_id"])
            if self.eval_round:  # its node may be new: the round in progress (or ended), where its env workers read it
                ray.get(actor.topo_eval_round.remote(self.eval_round), timeout=ROUND_S)
        self.recovery.instantiated(c)

    def _wait(self, c: int, ref) -> Any:
        """``ray.get(ref)`` of subcollector ``c``'s new actor, raising the run's failure meanwhile: a restart late
        past the startup deadline, or one that no node left in the cluster can hold (its node was lost)."""
        import ray

        looked = time.monotonic()
        while not ray.wait([ref], timeout=POLL_S)[0]:
            self.recovery.tick()
            if time.monotonic() - looked > NODES_EVERY_S:
                looked = time.monotonic()
                node = self._node(c)
                if node and not _node_alive(node["node_id"]) and not _placeable(self.plan, c):
                    self.recovery.judge(c, self._lost_node(c, node), first_records=False)
        return ray.get(ref)

    def _lost_node(self, c: int, node: dict) -> failures.Failure:
        held = [i for i, row in enumerate(self.actor_placement or []) if row["actual"]["node_id"] == node["node_id"]]
        return self.recovery.blame(lambda state: failures.node_lost(state, c, held or [c], _where(node), time.time()))

    def lost(self, err: BaseException) -> BaseException:
        """Ray's error for a dead actor as topo's: the subcollector, its node and its plan rows.

        Ray names the actor (``actor_id``); any other error (gloo's, when a weight update meets a dead peer) is
        about a dead actor when one no longer answers; else it is returned as it was.
        """
        from ray.exceptions import RayActorError

        actors = self.actors
        ids = [actor._actor_id.hex() for actor in actors]
        index = ids.index(err.actor_id) if getattr(err, "actor_id", None) in ids else _first_dead(actors)
        if index is None:
            return LaunchError(f"a Ray actor of this run died: {reason(err)}") if isinstance(err, RayActorError) else err
        node = self._node(index)
        rows = [row["global_index"] for row in self.plan_rows[index]]
        where = f" on {node['hostname']} (node {node['node_id'][:12]})" if node else ""
        return LaunchError(f"subcollector {index}'s Ray actor died{where}, with env workers {rows} (global indices): "
                           f"{reason(err)}", subcollector=index)

    def update_policy_weights_(self, policy) -> None:
        """Every actor applies ``policy``'s weights (its ``version`` buffer with them) before this returns; an actor
        found dead meanwhile is restarted (it starts from these weights) or named."""
        try:
            self.collector.update_policy_weights_(policy)
        except Exception as err:  # noqa: BLE001 - Ray's or gloo's: named when an actor died
            found = self.lost(err)
            if found is err:
                raise
            index = found.subcollector
            if self.recovery is None or index is None:
                raise found from None
            self._failed(index, err)
            self._restart(index)


def _end(actor) -> None:
    """End a replaced actor: its env workers first (it may hold them still), then the actor."""
    import ray

    try:
        ray.get(actor.topo_end_workers.remote(), timeout=END_S)
    except Exception:  # noqa: BLE001 - dead or stuck: killed below
        pass
    ray.kill(actor, no_restart=True)


def _where(node: dict) -> str:
    return f"{node.get('hostname', 'an unknown host')} (node {node.get('node_id', '?')[:12]})"


def _placeable(plan: dict[str, Any], c: int) -> bool:
    """Whether an alive node of the cluster holds every custom resource subcollector ``c`` is planned with."""
    import ray

    from topo.launch.ray.placement import holds

    wanted = plan["placement"]["subcollectors"][c]["resources"]["custom"]
    return any(n.get("Alive") and holds(n.get("Resources", {}), wanted) for n in ray.nodes())


def _ray_errors() -> tuple[type[BaseException], ...]:
    """What Ray raises for an actor that died or whose task failed."""
    from ray.exceptions import RayActorError, RayTaskError

    return RayActorError, RayTaskError


def _node_alive(node_id: str) -> bool:
    """Whether the cluster still counts node ``node_id`` alive."""
    import ray

    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())


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


class RayEngine:
    """The plan's subcollectors as Ray actors, reached through the cluster at ``placement.address``.

    ``weight_updates``: the trainer's weights reach every actor through torchrl's ``RayWeightSyncScheme``;
    ``restarts``: a subcollector's actor is made again with its plan rows (:class:`RayTopology`), unless the
    installed torchrl lacks what that needs (``restarts=False``: a failure then ends the run, named).
    """

    name = "ray"
    weight_sync = "ray"  # torchrl's RayWeightSyncScheme (gloo), whatever policy.weight_sync says

    def __init__(self, restarts: bool = True):
        self.capabilities = frozenset({"weight_updates", "restarts"} if restarts else {"weight_updates"})

    def check(self, plan: dict[str, Any]) -> None:
        check_reachable(plan["placement"])

    def connect(self, plan: dict[str, Any]) -> None:
        """Join the plan's cluster (``ray.init`` here, not in torchrl, so that a failure names the address); the
        job's runtime_env reaches every actor of the run: the subcollectors' and the inference server's."""
        import ray

        if ray.is_initialized():
            return
        placement = plan["placement"]
        try:
            ray.init(address=placement["address"], runtime_env=runtime_env(plan), log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise cannot_connect(placement["address"], err) from None

    def build(self, plan: dict[str, Any], **kwargs: Any) -> RayTopology:
        """A ``RayCollector`` whose actors hold their resources and built envs, the trainer's weights, and stand
        where the plan put them (else a LaunchError naming the subcollector).

        The actors' envs are built when this returns (RayCollector waits on every actor before it returns).
        Sync: each actor collects ``frames_per_batch / subcollectors`` frames and the batch stacks them;
        async: each batch is one actor's ``frames_per_batch``, as with the local multi collectors.
        Whatever fails here ends the actors it started.
        """
        deadline = time.monotonic() + plan["launch"]["startup_timeout"]
        topology = None
        try:
            topology = self._collector(plan, kwargs)
            self._ready(plan, topology, deadline)
        except BaseException:
            if topology is not None:
                self.shutdown(topology, teardown.shutdown_budget(plan))
            raise  # actors torchrl made before it raised end with the job (disconnect)
        return topology

    def _collector(self, plan: dict[str, Any], kwargs: dict[str, Any]) -> RayTopology:
        """The ``RayCollector``: one :class:`~.ray_node.NodeCollector` actor per subcollector.

        The policy arguments a run gives (:meth:`~.policy.Placement.collector_kwargs`: ``policy_factory``,
        the trainer's ``policy`` and a local weight-sync scheme) become: each actor builds its copy with the
        factory, and a ``RayWeightSyncScheme`` whose source is the trainer's ``policy`` carries the weights.
        ``policy`` is not passed on: RayCollector would pickle it to the actors instead of calling the
        factory there, and a scheme without a source calls the factory in the trainer.
        """
        from topo.launch.subcollector import env_factories
        from topo.launch.ray.node import NodeCollector
        from topo.launch.ray.respawn import RespawningRayCollector

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
                                                      "subcollector": c, "hang_timeout": plan["launch"].get("hang_timeout")}}
                            for c in range(len(placement["subcollectors"]))]
        collector = RespawningRayCollector(
            env_factories(plan),
            frames_per_batch=plan["collector"]["frames_per_batch"],
            total_frames=math.inf,
            sync=plan["collector"]["sync"],
            collector_class=NodeCollector,  # one env per actor: its ParallelEnv (no extra process layer)
            collector_kwargs=collector_kwargs,
            remote_configs=[sub["remote_config"] for sub in placement["subcollectors"]],
            # an inference server's actor holds the policy's weights (the trainer pushes them there): the actors' clients
            # need no scheme, and torchrl's default one would make a gloo group for them
            weight_sync_schemes={"policy": scheme} if scheme is not None else {} if placement.get("server") else None,
            **kwargs,
        )
        topology = RayTopology(collector, plan)
        topology.scheme = scheme
        return topology

    def _ready(self, plan: dict[str, Any], topology: RayTopology, deadline: float) -> None:
        """The actors' weights, nodes and records, before the first batch: the copies start with the trainer's
        weights (as on one machine), each actor says where it runs and the placement is checked; per node,
        the records written so far come to the trainer, then every :data:`~.ray_records.PULL_EVERY_S` seconds."""
        import ray

        from topo.launch.ray import placement as ray_placement
        from topo.launch.ray.records import NodePuller

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

    def set_eval_round(self, topology: RayTopology, number: int) -> None:
        """Each actor writes the round (or its end) where its node's env workers read it (per-node run directories)."""
        import ray

        topology.eval_round = number
        if topology.plan["placement"].get("run_dir", "per_node") == "per_node":
            ray.get([actor.topo_eval_round.remote(number) for actor in topology.actors], timeout=ROUND_S)

    def supervise(self, topology: RayTopology, recovery) -> None:
        """The run judges each failed actor and decides its restart (:class:`RayTopology`)."""
        topology.recovery = recovery

    def shutdown(self, topology: RayTopology, timeout: float) -> list[None]:
        """Close every actor's env, bring their nodes' last records, then end the actors, within ``timeout``
        seconds overall (the inference server's actor, if any, is the run's to end, then :meth:`disconnect`).

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
        return [None] * len(actors)

    def disconnect(self) -> None:
        """The job ends: Ray ends whatever actor of it is left."""
        import ray

        ray.shutdown()


def _likely_cause(dead: tuple[int, int, int | None], hung: dict[int, float]) -> tuple[int, int]:
    """Sort key of an actor's dead env workers, the cause first: one its watch killed as hung, then one killed
    by a signal other than SIGTERM (torchrl ends a dead worker's siblings so), then one that failed, then any;
    by index within each."""
    index, _, exitcode = dead
    if index in hung:
        return 0, index
    if exitcode is not None and exitcode < 0 and exitcode != -signal.SIGTERM:
        return 1, index
    return (2 if exitcode not in (0, -signal.SIGTERM) else 3), index

