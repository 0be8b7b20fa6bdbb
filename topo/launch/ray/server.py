"""The inference server as a Ray actor (``policy.placement: server`` under ``placement.engine: ray``).

torchrl's ``InferenceServer(service_backend="ray")`` builds the policy inside an actor that asks for the
plan's ``placement.server`` (its ``remote_config``); its clients (``RayTransport``'s, over Ray queues) are
picklable and answer from any actor of the cluster. The served policy's record (its keys, or its factory's
traceback) reaches the trainer through a Ray queue, since the actor's node may share no filesystem with
the trainer. While the run collects, a thread asks the actor after its health: an actor that died (or
whose node left) is the run's ``server-died`` failure, named with its node.
"""
from __future__ import annotations

import functools
import threading
import time
from typing import Any, Callable

from topo.errors import LaunchError
from topo.runtime.rundir import RunDir
from topo.launch.supervision import failure as failures
from topo.launch.ray import placement as ray_placement

WATCH_EVERY_S = 2.0  # between two looks at the server actor's health
NOTES_S = 5.0  # for the server's record once its actor answered


def start(factory: Callable, device: str | None, actor: dict[str, Any], startup_timeout: float, run: RunDir,
          on_death: Callable[[failures.Failure], None]):
    """The started server (:class:`RayServer`): ``factory(notes)`` is the policy factory the actor calls with the
    queue its records go to; they are written in ``run``. Raises :class:`LaunchError` when no alive node holds what
    ``actor`` asks for, or the actor is not up within ``startup_timeout`` (torchrl's wait on it has no deadline)."""
    from ray.util.queue import Queue
    from torchrl.modules.inference_server import InferenceServer

    _check_placeable(actor)
    notes = Queue(actor_options={"num_cpus": 0})
    made: dict[str, Any] = {}

    def make():
        try:
            made["server"] = InferenceServer(
                policy_factory=functools.partial(factory, notes), service_backend="ray",
                service_backend_options={"remote_config": actor["remote_config"]},
                **({"policy_device": device} if device else {}))
        except BaseException as err:  # noqa: BLE001 - handed to the trainer's thread
            made["error"] = err

    builder = threading.Thread(target=make, name="topo-ray-server-start", daemon=True)
    builder.start()
    builder.join(max(1.0, startup_timeout))
    records = []
    try:
        records = _drain(notes, NOTES_S if "server" in made else 0.0)
        for record in records:
            run.add("markers", record)
    finally:
        notes.shutdown(force=True)
    if builder.is_alive():
        raise LaunchError(f"the inference server's Ray actor was not up within {startup_timeout:.0f}s (it asks for "
                          f"{_asks(actor)}): `ray status` shows what the cluster has free")
    if "error" in made:
        why = ray_placement.reason(made["error"])
        raise LaunchError(f"the inference server's Ray actor failed to start: {why}") from made["error"]
    served = next((r for r in records if r["name"] == "server"), None)
    if served is None:
        made["server"].shutdown(timeout=NOTES_S)
        raise LaunchError(f"the inference server's Ray actor is up but its record did not arrive within {NOTES_S:g}s")
    return RayServer(made["server"], placed(actor, served["actor"]), on_death)


class RayServer:
    """torchrl's Ray inference server, with its actor's placement row (planned beside actual, as a subcollector's)
    and the :class:`Watch` on its health, started here and stopped at :meth:`shutdown`."""

    def __init__(self, server, placement: dict[str, Any], on_death: Callable[[failures.Failure], None]):
        self.server = server
        self.placement = placement
        actual = placement["actual"]
        self.watch = Watch(server, on_death, f"pid {actual['pid']} on {actual['hostname']} (node {actual['node_id'][:12]})")
        self.watch.start()

    def verify(self) -> None:
        """Raise :class:`LaunchError` when the actor does not hold what the plan asks (its node, its GPUs)."""
        verify(self.placement)

    def client(self):
        return self.server.client()

    def update_model_weights(self, weights) -> None:
        self.server.update_model_weights(weights)

    def shutdown(self, timeout: float) -> None:
        self.watch.stop()  # its end is the run's, not a death
        self.server.shutdown(timeout=timeout)


def verify(row: dict[str, Any]) -> None:
    """Raise :class:`LaunchError` when the server actor's placement row shows a problem."""
    if row["problems"]:
        actual = row["actual"]
        raise LaunchError(f"the inference server is not where the plan put it: its actor on {actual['hostname']} "
                          f"(node {actual['node_id'][:12]}) " + "; ".join(row["problems"]))


def placed(actor: dict[str, Any], reported: dict[str, Any]) -> dict[str, Any]:
    """The server actor's row, as a subcollector's (:func:`~.ray_placement.compare`): planned beside actual."""
    import ray

    totals = {node["NodeID"]: node.get("Resources", {}) for node in ray.nodes()}
    row = ray_placement.compare({"placement": {"subcollectors": [actor]}}, [{**reported, "run_dir": None}], totals)[0]
    return {**row, "subcollector": None}


def _drain(notes, wait: float) -> list[dict]:
    """The records in ``notes``: every one there now, waiting up to ``wait`` seconds for the first."""
    from ray.util.queue import Empty

    out = []
    try:
        out.append(notes.get(timeout=wait) if wait else notes.get_nowait())
        while True:
            out.append(notes.get_nowait())
    except Empty:
        return out


def _check_placeable(actor: dict[str, Any]) -> None:
    """Some alive node of the cluster holds, in total, what the server asks for."""
    import ray

    config = actor["remote_config"]
    wanted = {"CPU": config.get("num_cpus", 1), "GPU": config.get("num_gpus", 0), **config.get("resources", {})}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if not any(ray_placement.holds(n.get("Resources", {}), wanted) for n in nodes):
        raise LaunchError(f"no node of the Ray cluster holds the inference server's request ({_asks(actor)}); "
                          f"its {len(nodes)} alive node(s) have: "
                          + "; ".join(_has(n.get("Resources", {})) for n in nodes))


def _asks(actor: dict[str, Any]) -> str:
    r = actor["resources"]
    return ", ".join([f"{r['cpus']:g} CPU", f"{r['gpus']:g} GPU", *(f"{k} {v:g}" for k, v in r["custom"].items())])


def _has(totals: dict[str, float]) -> str:
    return ", ".join([f"{totals.get('CPU', 0):g} CPU", f"{totals.get('GPU', 0):g} GPU",
                      *(f"{k} {v:g}" for k, v in ray_placement.custom_resources(totals).items())])


class Watch:
    """A thread that asks the server's actor after its health every :data:`WATCH_EVERY_S` seconds; an actor
    that does not answer alive is the run's ``server-died`` failure, handed to ``on_death`` once."""

    def __init__(self, server, on_death: Callable[[failures.Failure], None], where: str):
        self.server = server
        self.on_death = on_death
        self.where = where
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="topo-ray-server-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            if not self.server.is_alive and not self._stop.is_set():
                self.on_death(failures.server_actor_died(self.where, time.time()))
                return
