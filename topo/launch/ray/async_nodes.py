"""Async mode on Ray (``collector.mode: async`` under ``placement.engine: ray``): one actor per node, each running the
async loop of one machine over that node's plan rows.

Design: **a node's actor is the trainer of a local async run.** The plan's subcollectors are grouped by where the plan
puts them (:func:`node_groups`: those asking for the same custom resources share a node, hence an actor); each
:class:`AsyncNode` actor runs a :class:`topo.launch.run.Run` of its own over a plan of its rows only
(:func:`node_plan`: the same rows, subcollector indices, seeds and launch section, on the local engine): the
``AsyncBatchedCollector``, its inference server (a process of the actor's, on its node: the actor asks for
``placement.server``'s CPUs and GPUs besides its rows'), the env workers from a forkserver, restarts, hang detection
and the run's records, all as on one machine (:mod:`topo.launch.async_mode`), the actor's process standing for the
trainer. Its watcher ends what the actor started when the actor dies (the trainer SIGKILLed: Ray ends its actors).

In the trainer, :class:`RayAsyncTopology` merges the node actors' batches as they come (each batch one node's
``frames_per_batch``, its ``env_index`` the step's row in the whole plan), pushes the trainer's weights to every
node's server (:meth:`RayAsyncTopology.update_policy_weights_`: each returns its server's version, which every step
it serves carries), and brings each node's run directory into the trainer's under ``nodes/<node id>/``
(:class:`~.records.NodePuller`). A node run's failure (a restart budget spent, a startup past its deadline) ends the
trainer's run, named by the node's own message. Each node's report, as its run closes, is merged into the trainer's
(its restarts, workers, closes, leftovers: :func:`topo.launch.report.merge_nodes`).
"""
from __future__ import annotations

import copy
import json
import os
import shutil
import time
from typing import Any, Iterator

from topo.errors import LaunchError
from topo.runtime.rundir import RUN_DIR_VAR
from topo.launch import forkserver
from topo.launch.supervision import teardown

NODES = "nodes"  # the trainer's run directory: each node's run directory, under its node id's first 12 characters
POLL_S = 0.5


def node_groups(plan: dict[str, Any]) -> list[list[int]]:
    """The plan's subcollectors grouped by node: those whose requests name the same custom resources share one
    actor; one that names none gets an actor of its own (Ray places it)."""
    groups: dict[str, list[int]] = {}
    for sub, placed in zip(plan["subcollectors"], plan["placement"]["subcollectors"]):
        custom = placed["resources"]["custom"]
        key = json.dumps(sorted(custom.items())) if custom else f"sub{sub['index']}"
        groups.setdefault(key, []).append(sub["index"])
    return list(groups.values())


def remote_config(plan: dict[str, Any], subs: list[int]) -> dict[str, Any]:
    """What a node's actor asks Ray for: its custom resources, the most CPUs and GPUs any of its subcollectors asks,
    plus ``placement.server``'s (its server is a process of the actor)."""
    placed = [plan["placement"]["subcollectors"][c]["remote_config"] for c in subs]
    server = (plan["placement"].get("server") or {}).get("remote_config") or {}
    config: dict[str, Any] = {"num_cpus": max(p.get("num_cpus", 1) for p in placed) + server.get("num_cpus", 0),
                              "num_gpus": max(p.get("num_gpus", 0) for p in placed) + server.get("num_gpus", 0)}
    if placed[0].get("resources"):
        config["resources"] = dict(placed[0]["resources"])
    return config


def node_plan(plan: dict[str, Any], subs: list[int]) -> dict[str, Any]:
    """The plan a node's actor runs: its subcollectors only (their indices, rows and seeds as planned), on the local
    engine, collecting without end (the trainer counts frames), no eval section."""
    out = copy.deepcopy(plan)
    out["subcollectors"] = [sub for sub in out["subcollectors"] if sub["index"] in subs]
    out["placement"] = {"engine": "local"}
    out["collector"] = {**out["collector"], "total_frames": -1}
    out["eval"] = None
    return out


def global_rows(plan: dict[str, Any], subs: list[int]) -> list[int]:
    """Each row of ``subs`` (in order), as its place among every row of the plan (a step's ``env_index``)."""
    rows = [(sub["index"], row["index"]) for sub in plan["subcollectors"] for row in sub["workers"]]
    return [rows.index((sub["index"], row["index"])) for sub in plan["subcollectors"] if sub["index"] in subs
            for row in sub["workers"]]


class AsyncNode:
    """A Ray actor: the async run of one node (:meth:`start`), its batches (:meth:`next`), weight pushes
    (:meth:`update`), its records (:meth:`topo_files`) and its end (:meth:`close`)."""

    def __init__(self, plan: dict[str, Any], subs: list[int], trainer_run_dir: str, node_run, policy_factory=None):
        """``node_run``: what runs a plan on this machine (:class:`topo.launch.run.Run`, given by the trainer's run);
        ``policy_factory``: the trainer's (over the plan's policy section), for this node's server."""
        from topo.launch.ray import placement as ray_placement
        from topo.launch.ray.records import records_dir

        here = ray_placement.here()
        os.environ.pop(RUN_DIR_VAR, None)  # the trainer's; this node's run sets its own in its launch window
        self.subs = subs
        self.plan = node_plan(plan, subs)
        self.rows = global_rows(plan, subs)
        self.node_dir = records_dir({"run_dir": trainer_run_dir, "mode": "per_node", "subcollector": subs[0]},
                                    here["node_id"], here["hostname"])
        self.prefix = os.path.join(NODES, here["node_id"][:12])
        self.here = {"node_id": here["node_id"], "hostname": here["hostname"]}
        self.node_run = node_run
        self.run = self.batches = self.lookup = None
        self.policy_factory = policy_factory

    def start(self) -> dict[str, Any]:
        """The node's run started (every env built); where it runs and its run directory."""
        import torch

        from topo.launch.options import Options
        from topo.launch.ray import placement as ray_placement

        self.run = self.node_run(self.plan, Options(policy_factory=self.policy_factory, report_dir=self.node_dir, progress=False))
        self.run.start()
        self.batches = iter(self.run.collector)
        self.lookup = torch.tensor(self.rows)
        return {**ray_placement.here(), "run_dir": self.run.run_dir, "subcollectors": self.subs, "prefix": self.prefix}

    def next(self):
        """The node's next batch, each step's ``env_index`` its row's place in the whole plan."""
        from topo.launch import boundary

        batch = next(self.batches)
        key = boundary.env_index_key()
        index = batch.get(key, None)
        if index is not None:
            batch.set(key, self.lookup[index])
        return batch

    def update(self, weights) -> int:
        """The trainer's weights to this node's server (applied when this returns); the server's version."""
        return self.run.update_weights(weights)

    def topo_files(self, known: dict[str, tuple[int, int, int]], remove: bool = False) -> list:
        """The node run's new records, under ``nodes/<node>/`` (:func:`~.records.node_files`); ``remove``: then its
        directory is deleted (the run is over on this node)."""
        from topo.launch.ray.records import node_files

        run_dir = self.run.run_dir if self.run is not None and self.run.run_dir else None
        out = node_files(self.node_dir, known, self.prefix) if run_dir else []
        if remove:
            shutil.rmtree(self.node_dir, ignore_errors=True)
        return out

    def close(self) -> dict[str, Any] | None:
        """The node's run ended (envs closed, server and forkserver ended); its report (``summary.json``, its plan
        aside), with where it ran and its rows' places in the whole plan (``rows``)."""
        if self.run is None:
            return None
        self.run.close()
        forkserver.remove_temp_dir()  # Ray SIGKILLs this actor next: its exit would have removed it
        if self.run.report is None:
            return None
        return {**{k: v for k, v in self.run.report.data.items() if k != "plan"}, "rows": self.rows,
                "node": {**self.here, "subcollectors": self.subs,
                         "records": os.path.join(self.prefix, os.path.basename(self.run.run_dir or ""))}}

    def __repr__(self) -> str:
        return f"AsyncNode(subcollectors {self.subs})"


class RayAsyncTopology:
    """The node actors' batches as they come, up to ``total_frames`` (-1: no end); weight pushes to every node."""

    def __init__(self, plan: dict[str, Any], actors: list, groups: list[list[int]]):
        self.plan, self.actors, self.groups = plan, actors, groups
        self.total_frames = plan["collector"]["total_frames"]
        self.nodes: list[dict] = []  # what each actor said of itself when it started
        self.puller = None
        self.on_batch = None  # the run's digest (:mod:`topo.launch.digest`)
        self.server_versions: list[int] = [0] * len(actors)  # each node server's version, after the last push
        self.node_reports: list[dict] = []  # each node run's report once closed (:meth:`AsyncNode.close`), merged into the
        # trainer's (:func:`topo.launch.report.merge_nodes`)

    def __iter__(self) -> Iterator[Any]:
        import ray

        frames = 0
        pending = {actor.next.remote(): i for i, actor in enumerate(self.actors)}
        while True:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            if not ready:
                continue
            i = pending.pop(ready[0])
            batch = self._get(i, ready[0])
            pending[self.actors[i].next.remote()] = i
            if self.on_batch is not None:
                self.on_batch(batch)
            yield batch
            frames += batch.numel()
            if 0 < self.total_frames <= frames:
                return

    def update_policy_weights_(self, weights) -> None:
        """Every node's server applies ``weights`` (under ``policy``: :class:`~topo.launch.async_mode.ServedPlacement`)
        before this returns; their versions are kept (:attr:`server_versions`)."""
        import ray

        refs = [actor.update.remote(weights.get("policy")) for actor in self.actors]
        self.server_versions = [self._get(i, ref) for i, ref in enumerate(refs)]

    def _get(self, i: int, ref):
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return ray.get(ref)
        except (RayActorError, RayTaskError) as err:
            subs = self.groups[i]
            where = self.nodes[i] if i < len(self.nodes) else {}
            on = f" on {where['hostname']} (node {where['node_id'][:12]})" if where else ""
            raise LaunchError(f"the async run of subcollector(s) {subs}{on} failed: "
                              f"{str(getattr(err, 'cause', None) or err).strip()}", subcollector=subs[0]) from None


class RayAsyncEngine:
    """Async mode under ``placement.engine: ray``: one :class:`AsyncNode` actor per node (:func:`node_groups`).
    ``serves_policy``: each node's run serves the policy (the trainer's run starts no server); ``weight_updates``:
    pushes reach every node's server; ``runs_nodes``: the trainer's run gives it :attr:`node_run`, what runs each
    node's rows there. Restarts are each node run's own (none decided by the trainer)."""

    name = "ray"
    capabilities: frozenset[str] = frozenset({"serves_policy", "weight_updates", "runs_nodes"})
    weight_sync = None
    policy_setup = None
    node_run = None  # topo.launch.run.Run

    def check(self, plan: dict[str, Any]) -> None:
        from topo.launch.ray.engine import check_reachable

        check_reachable(plan["placement"])

    def connect(self, plan: dict[str, Any]) -> None:
        from topo.launch.ray.engine import RayEngine

        RayEngine.connect(self, plan)

    def disconnect(self) -> None:
        import ray

        ray.shutdown()

    def set_eval_round(self, collector, number: int) -> None:
        """No eval section under async mode on Ray (refused at validate)."""

    def supervise(self, collector, recovery) -> None:
        """Each node's run restarts its own env workers."""

    def build(self, plan: dict[str, Any], **kwargs: Any) -> RayAsyncTopology:
        """Every node's actor started, its run built (every env), within ``launch.startup_timeout``; the records so
        far pulled, then every :data:`~.records.PULL_EVERY_S` seconds. Whatever fails here ends the actors."""
        import ray

        from topo.launch.ray.records import NodePuller

        pre, post = kwargs.pop("pre_collect_hook", None), kwargs.pop("post_collect_hook", None)
        user = [h for h in (pre, post) if getattr(h, "keywords", {}).get("user_hook") is not None]
        if user or kwargs:
            from topo.errors import UsageError

            raise UsageError("collector.mode async on Ray takes no collector keywords or hooks yet "
                             f"(given: {sorted(kwargs) + ['a collect hook'] * bool(user)})")
        deadline = time.monotonic() + plan["launch"]["startup_timeout"]
        run_dir = os.path.abspath(os.environ[RUN_DIR_VAR])
        groups = node_groups(plan)
        actors = [ray.remote(**remote_config(plan, subs))(AsyncNode).remote(
            plan, subs, run_dir, self.node_run, self.policy_setup.factory if self.policy_setup is not None else None)
            for subs in groups]
        topology = RayAsyncTopology(plan, actors, groups)
        try:
            started = [actor.start.remote() for actor in actors]
            while True:
                done, _ = ray.wait(started, num_returns=len(started), timeout=POLL_S)
                if len(done) == len(started):
                    break
                if time.monotonic() > deadline:
                    raise LaunchError(f"the async runs of the Ray nodes were not built within "
                                      f"{plan['launch']['startup_timeout']:g}s (`ray status` shows what the cluster has free)")
            topology.nodes = [topology._get(i, ref) for i, ref in enumerate(started)]
            topology.puller = NodePuller(run_dir, actors, [node["node_id"] for node in topology.nodes])
            topology.puller.pull(timeout=max(1.0, deadline - time.monotonic()))
            topology.puller.start()
        except BaseException:
            self.shutdown(topology, teardown.shutdown_budget(plan))
            raise
        return topology

    def shutdown(self, topology: RayAsyncTopology, timeout: float) -> list[None]:
        """Every node's run closed (its envs, server, forkserver), its last records pulled and its directory removed,
        then the actors ended, within ``timeout`` seconds (the graceful share) and a node teardown's stages."""
        import ray

        from topo.launch.supervision.teardown import STAGES_S

        # each node's run tears down as one machine's does: its graceful share (this one's), then its stages
        waited = timeout + sum(STAGES_S.values())
        deadline = time.monotonic() + waited
        if topology.puller is not None:
            topology.puller.stop()
        closing = [actor.close.remote() for actor in topology.actors]
        done, _ = ray.wait(closing, num_returns=len(closing), timeout=max(0.0, deadline - time.monotonic() - 5))
        topology.node_reports = []
        for i, ref in enumerate(closing):
            try:
                closed = ray.get(ref, timeout=0) if ref in done else {"ok": False, "error": {
                    "type": "Timeout", "message": f"the node's run was not closed within {waited:g}s", "in": "topo"}}
            except Exception as err:  # noqa: BLE001 - a dead actor: its node's records stay there
                closed = {"ok": False, "error": {"type": type(err).__name__, "message": str(err)[-3000:], "in": "topo"}}
            closed = closed or {"ok": False, "error": {"type": "NotStarted", "message": "the node's run never started",
                                                       "in": "topo"}}
            where = topology.nodes[i] if i < len(topology.nodes) else {}
            closed.setdefault("node", {"node_id": where.get("node_id"), "hostname": where.get("hostname"),
                                       "subcollectors": topology.groups[i], "records": None})
            topology.node_reports.append(closed)
        if topology.puller is not None:
            topology.puller.pull(timeout=max(1.0, (deadline - time.monotonic()) / 2), remove=True)
        for actor in topology.actors:
            ray.kill(actor, no_restart=True)
        return [None] * len(topology.plan["subcollectors"])


def nodes_dir(run_dir: str) -> str:
    return os.path.join(run_dir, NODES)


def node_runs(trainer_run_dir: str) -> list[str]:
    """The node run directories pulled into the trainer's run directory so far (each ``nodes/<node>/topo-run-*``)."""
    root = nodes_dir(trainer_run_dir)
    return sorted(os.path.join(root, node, name) for node in (os.listdir(root) if os.path.isdir(root) else [])
                  for name in os.listdir(os.path.join(root, node)) if name.startswith("topo-run-"))


__all__ = ["AsyncNode", "RayAsyncEngine", "RayAsyncTopology", "node_groups", "node_plan", "node_runs", "remote_config"]
