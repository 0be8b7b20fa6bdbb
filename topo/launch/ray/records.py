"""In the trainer: every node's run-directory records, brought into the trainer's run directory through Ray.

With ``placement.run_dir: per_node`` the subcollectors, policies and env workers of each node write their
records (markers, observed batches, heartbeats) in a directory of that node (:mod:`.ray_node`). A
:class:`NodePuller` asks one actor per node for the files written there since it last asked, and writes
them, each atomically, at the same relative path in the trainer's run directory, where the monitor and the
report read them as if they had been written there: when the actors are ready, every
:data:`PULL_EVERY_S` seconds while the run collects, and at shutdown once every env is closed.
"""
from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

from topo.runtime.episodes import FOLDER as EPISODES
from topo.errors import LaunchError

PULL_EVERY_S = 2.0
NODE_RUNS = "topo-node-runs"  # under a node's temp dir: one folder per (run, node)


def node_run_dir(trainer_run_dir: str, node_id: str) -> str:
    """A node's own run directory for the run whose trainer writes ``trainer_run_dir``."""
    return os.path.join(tempfile.gettempdir(), NODE_RUNS, f"{os.path.basename(trainer_run_dir)}-{node_id[:12]}")


def records_dir(records: dict[str, Any], node_id: str, host: str) -> str:
    """Where an actor's records go (``records``: ``{"run_dir", "mode", "subcollector"}``): its node's own
    directory (``per_node``, created), or the trainer's (``shared``), which must be visible on this node."""
    if records["mode"] == "per_node":
        path = node_run_dir(records["run_dir"], node_id)
        os.makedirs(path, exist_ok=True)
        return path
    if not os.path.exists(os.path.join(records["run_dir"], "launch.json")):
        raise LaunchError(f"placement.run_dir is 'shared' but the run directory {records['run_dir']} is not visible on "
                          f"node {host} ({node_id[:12]}): its records would be lost; put --report on a filesystem "
                          "every node mounts, or use placement.run_dir: per_node", subcollector=records["subcollector"])
    return records["run_dir"]


def appended(rel: str) -> bool:
    """Whether a record grows by appends (episode records and recorded steps: :mod:`topo.runtime.episodes`), so that a
    pull brings its new bytes only: a days-long run's episode files are not sent again every few seconds. Retention
    (``launch.retain_episodes``) rewrites one as a new file: its inode tells, and it is sent whole."""
    return rel.startswith(EPISODES + os.sep)


def node_files(run_dir: str, known: dict[str, tuple[int, int, int]], prefix: str = ""
               ) -> list[tuple[str, int, int, bytes, int, int]]:
    """The files under ``run_dir`` that ``known`` (relative path -> (mtime_ns, size, inode), what the trainer holds)
    lacks or holds older, as (relative path, mtime_ns, size, content, offset, inode), each path under ``prefix``
    (a folder of the trainer's run directory, or ``""``): an append-only record (:func:`appended`) that grew in place
    sends only its new bytes, from ``offset``; any other file, or one rewritten since (another inode: retention),
    whole (offset 0), and every beats file (small; its mtime moves only when the kernel writes its pages back)."""
    from topo.runtime import heartbeat

    out = []
    for folder, _, files in os.walk(run_dir):
        for name in files:
            if name.endswith((".tmp", ".lock")):
                continue
            path = os.path.join(folder, name)
            inner = os.path.relpath(path, run_dir)
            rel = os.path.join(prefix, inner) if prefix else inner
            try:
                st = os.stat(path)
                had = tuple(known.get(rel, (0, 0, 0)))
                beats = inner.startswith(heartbeat.FOLDER + os.sep)  # sent each time: its map's writes move no mtime
                if had == (st.st_mtime_ns, st.st_size, st.st_ino) and not beats:
                    continue
                offset = had[1] if appended(inner) and had[2:] == (st.st_ino,) and 0 < had[1] <= st.st_size else 0
                with open(path, "rb") as f:
                    f.seek(offset)
                    content = f.read(st.st_size - offset)
            except OSError:  # replaced while listed: the next call brings it
                continue
            out.append((rel, st.st_mtime_ns, st.st_size, content, offset, st.st_ino))
    return out


def write_files(run_dir: str, files: list[tuple[str, int, int, bytes, int, int]],
                known: dict[str, tuple[int, int, int]]) -> int:
    """Write each (relative path, mtime_ns, size, content, offset, inode on its node) under ``run_dir`` and note it in
    ``known``: a
    whole file (offset 0) atomically, new bytes of an appended record at ``offset`` (a file here of another size
    is forgotten, so that the next pull brings it whole). The number written."""
    root = os.path.realpath(run_dir)
    n = 0
    for rel, mtime_ns, size, content, offset, ino in files:
        dest = os.path.realpath(os.path.join(root, rel))
        if os.path.commonpath([root, dest]) != root:  # never outside the run directory
            continue
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if offset:
            if not os.path.exists(dest) or os.path.getsize(dest) != offset:
                known.pop(rel, None)
                continue
            with open(dest, "r+b") as f:
                f.seek(offset)
                f.write(content)
        else:
            tmp = f"{dest}.pull.tmp"
            with open(tmp, "wb") as f:
                f.write(content)
            os.replace(tmp, dest)
        known[rel] = (mtime_ns, size, ino)
        n += 1
    return n


class NodePuller:
    """Pulls the records of each node where an actor runs; ``actors``: the subcollectors' actor handles,
    ``nodes``: each one's node id (:meth:`~.ray_node.NodeCollector.topo_node`)."""

    def __init__(self, run_dir: str, actors: list[Any], nodes: list[str]):
        self.run_dir = run_dir
        self.by_node: dict[str, list[Any]] = {}
        for actor, node in zip(actors, nodes):
            self.by_node.setdefault(node, []).append(actor)
        self.known: dict[str, dict[str, tuple[int, int, int]]] = {node: {} for node in self.by_node}  # what each node sent
        self.pulled = 0  # files written so far
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pull(self, timeout: float, remove: bool = False) -> int:
        """One round: each node's new files, from the first of its actors that answers within ``timeout``."""
        import ray

        with self._lock:
            n = 0
            for node, actors in self.by_node.items():
                for actor in actors:
                    try:
                        files = ray.get(actor.topo_files.remote(self.known[node], remove=remove), timeout=timeout)
                    except Exception:  # noqa: BLE001 - a dead or busy actor: its node's next one
                        continue
                    n += write_files(self.run_dir, files, self.known[node])
                    break
            self.pulled += n
            return n

    def replace(self, old: Any, new: Any, node: str) -> None:
        """Actor ``old`` was replaced by ``new``, on ``node``: pull through ``new`` (from ``node``, if new to it)."""
        with self._lock:
            for actors in self.by_node.values():
                if old in actors:
                    actors.remove(old)
            self.by_node.setdefault(node, []).append(new)
            self.known.setdefault(node, {})

    def start(self, every: float = PULL_EVERY_S) -> None:
        """Pull every ``every`` seconds in a thread until :meth:`stop`."""
        def loop():
            while not self._stop.wait(every):
                self.pull(timeout=every * 5)

        self._thread = threading.Thread(target=loop, name="topo-ray-records", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
