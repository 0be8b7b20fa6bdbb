"""Inside a Ray actor: the subcollector's collector, told where its node keeps the run's records.

:class:`NodeCollector` is torchrl's single ``Collector`` plus what the trainer asks of an actor: where it
runs (:meth:`NodeCollector.topo_node`) and the files of its node's run directory
(:meth:`NodeCollector.topo_files`). Its constructor points ``TOPO_RUN_DIR`` at the run directory of its
node before the policy factory and the env factory run, so the subcollector's, its policy's and its env
workers' records land there:

- ``per_node``: a directory of this node's own (under the temp dir, named after the trainer's run directory
  and this node), which the trainer pulls through Ray (:mod:`.ray_records`);
- ``shared``: the trainer's run directory itself, which must then be visible here (else a LaunchError
  naming the subcollector and the node: its records would be lost).
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Any

from torchrl.collectors import Collector

from ..rundir import RUN_DIR_VAR
from .ray_records import NODE_RUNS, appended, records_dir


class NodeCollector(Collector):
    """``Collector`` of one subcollector in a Ray actor; ``topo_records``: ``{"run_dir", "mode", "subcollector"}``."""

    def __init__(self, *args: Any, topo_records: dict[str, Any], **kwargs: Any):
        import ray

        self._topo_node_id = ray.get_runtime_context().get_node_id()
        self._topo_run_dir = records_dir(topo_records, self._topo_node_id, socket.gethostname())
        os.environ[RUN_DIR_VAR] = self._topo_run_dir  # the policy and env factories below, and the env workers, write here
        super().__init__(*args, **kwargs)

    def topo_node(self) -> dict[str, Any]:
        """Where this actor runs: node id, host, pid, the resources Ray assigned it, its GPUs, its run directory."""
        import ray

        context = ray.get_runtime_context()
        return {"node_id": self._topo_node_id, "hostname": socket.gethostname(), "pid": os.getpid(),
                "assigned": dict(context.get_assigned_resources()),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "run_dir": self._topo_run_dir}

    def topo_files(self, known: dict[str, tuple[int, int]], remove: bool = False) -> list[tuple[str, int, int, bytes, int]]:
        """The files of this node's run directory that ``known`` (relative path -> (mtime_ns, size), what the
        trainer holds) lacks or holds older, as (relative path, mtime_ns, size, content, offset): an append-only
        record (:func:`~.ray_records.appended`) that grew sends only its new bytes, from ``offset``; any other
        file whole (offset 0). ``remove``: then delete the directory (the run is over on this node).
        Stateless here: an answer the trainer never read loses nothing."""
        out = []
        for folder, _, files in os.walk(self._topo_run_dir):
            for name in files:
                if name.endswith((".tmp", ".lock")):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, self._topo_run_dir)
                try:
                    st = os.stat(path)
                    if tuple(known.get(rel, ())) == (st.st_mtime_ns, st.st_size):
                        continue
                    had = tuple(known.get(rel, (0, 0)))[1]
                    offset = had if appended(rel) and 0 < had <= st.st_size else 0
                    with open(path, "rb") as f:
                        f.seek(offset)
                        content = f.read(st.st_size - offset)
                except OSError:  # replaced while listed: the next call brings it
                    continue
                out.append((rel, st.st_mtime_ns, st.st_size, content, offset))
        if remove and self._topo_run_dir.startswith(os.path.join(tempfile.gettempdir(), NODE_RUNS)):
            shutil.rmtree(self._topo_run_dir, ignore_errors=True)
        return out
