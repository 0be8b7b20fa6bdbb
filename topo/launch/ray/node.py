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

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from typing import Any

from torchrl.collectors import Collector

from topo.runtime import heartbeat
from topo.runtime.rundir import NODE_VAR, RESTART_VAR, RUN_DIR_VAR, RunDir, set_eval_round
from topo.launch import boundary, forkserver
from topo.launch.ray import placement as ray_placement
from topo.launch.ray.records import NODE_RUNS, node_files, records_dir


WATCH_EVERY_S = 1.0  # how often an actor reads its env workers' heartbeats (launch.hang_timeout)


class EnvWorkersDied(RuntimeError):
    """The actor's rollout failed and some of its env workers had died. Its one argument is JSON (Ray rebuilds a
    task's exception from its arguments): :meth:`of` makes it, its properties read it."""

    @classmethod
    def of(cls, dead: list[tuple[int, int, int | None]], cause: str, hung: dict[int, float]) -> EnvWorkersDied:
        """``dead``: ``(index, pid, exitcode)`` each; ``hung``: those the actor's watch killed, with how long the
        rollout had waited on each."""
        return cls(json.dumps({"dead": dead, "cause": cause, "hung": {str(i): s for i, s in hung.items()}}))

    @property
    def dead(self) -> list[tuple[int, int, int | None]]:
        return [tuple(d) for d in json.loads(self.args[0])["dead"]]

    @property
    def hung(self) -> dict[int, float]:
        return {int(i): s for i, s in json.loads(self.args[0])["hung"].items()}

    def __str__(self) -> str:
        return f"env worker(s) {[d[0] for d in self.dead]} died ({json.loads(self.args[0])['cause']})"


class NodeCollector(Collector):
    """``Collector`` of one subcollector in a Ray actor; ``topo_records``: ``{"run_dir", "mode", "subcollector"}``,
    for a restarted subcollector ``"restart"`` (its processes' records say so), and ``"hang_timeout"`` (seconds,
    or None): an env worker whose step or reset runs longer is SIGKILLed by a thread of this actor, which reads
    their heartbeats on this node (the trainer may be elsewhere), and named as hung."""

    def __init__(self, *args: Any, topo_records: dict[str, Any], **kwargs: Any):
        import ray

        self._topo_node_id = ray.get_runtime_context().get_node_id()
        self._topo_where = (topo_records["subcollector"], topo_records.get("restart", 0))
        self._topo_run_dir = records_dir(topo_records, self._topo_node_id, socket.gethostname())
        os.environ[RUN_DIR_VAR] = self._topo_run_dir  # the policy and env factories below, and the env workers, write here
        os.environ[NODE_VAR] = self._topo_node_id[:12]  # their records name this node (topo top's node column)
        if topo_records.get("restart"):
            os.environ[RESTART_VAR] = str(topo_records["restart"])
        super().__init__(*args, **kwargs)
        self._topo_hung: dict[int, float] = {}
        if topo_records.get("hang_timeout") is not None:
            threading.Thread(target=self._topo_watch, args=(*self._topo_where, topo_records["hang_timeout"]),
                             name="topo-hang-watch", daemon=True).start()

    def __bool__(self) -> bool:
        """True. Ray asks ``if actor`` when a task fails; torchrl's ``__len__`` (batches to collect) is infinite
        here, and the TypeError it raises there kills the actor instead of returning the task's error."""
        return True

    def __repr__(self) -> str:
        """Short: the actor's name in Ray's logs and errors (torchrl's prints the env and the whole policy)."""
        return f"NodeCollector(subcollector {self._topo_where[0]}, restart {self._topo_where[1]})"

    def _topo_watch(self, subcollector: int, restart: int, timeout: float) -> None:
        """Every :data:`WATCH_EVERY_S`: SIGKILL the env workers that hang (:func:`~topo.runtime.heartbeat.waiting_on`): the rollout then fails,
        and :meth:`next` names them hung. When the rollout waits on none of them (the actor itself hangs, in its
        policy say), the actor ends itself: the trainer then restarts or names it as a dead actor."""
        while True:
            time.sleep(WATCH_EVERY_S)
            slots = heartbeat.read(self._topo_run_dir, subcollector, restart)
            health = heartbeat.health(self._topo_run_dir, subcollector, restart)
            if not slots or health is None:
                continue
            found = heartbeat.waiting_on(slots, [h.steps if h else 0 for h in health], timeout, time.time())
            if found is None:
                continue
            workers = boundary.env_worker_processes(self.env)
            if not found:
                os.kill(os.getpid(), signal.SIGKILL)
            for index, seconds in found.items():
                if index < len(workers) and index not in self._topo_hung:
                    self._topo_hung[index] = seconds
                    with contextlib.suppress(ValueError):  # closed: torchrl ended it
                        workers[index].kill()

    def next(self):
        """The next rollout; when it fails with env workers dead, :class:`EnvWorkersDied` names them (the
        trainer may be on another host, where their pids mean nothing)."""
        try:
            return super().next()
        except Exception as err:
            dead = boundary.dead_env_workers(self.env)
            if dead:
                raise EnvWorkersDied.of(dead, f"{type(err).__name__}: {err}".splitlines()[0], self._topo_hung) from err
            raise

    def topo_eval_round(self, number: int) -> None:
        """Evaluation round ``number`` starts (negative: ended): written where this node's env workers read it (their
        run directory)."""
        set_eval_round(RunDir(self._topo_run_dir), number)

    def topo_end_workers(self) -> None:
        """SIGKILL this actor's env workers (its subcollector is being replaced; its env cannot close), and remove
        its temp directory (Ray SIGKILLs the actor next)."""
        for proc in boundary.env_worker_processes(self.env):
            with contextlib.suppress(ValueError, OSError):  # closed (torchrl ended it) or gone
                proc.kill()
        forkserver.remove_temp_dir()

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        """torchrl's shutdown (the env closed), then this actor's temp directory removed: Ray SIGKILLs the actor
        next, and its exit would have removed it."""
        try:
            super().shutdown(*args, **kwargs)
        finally:
            forkserver.remove_temp_dir()

    def topo_node(self) -> dict[str, Any]:
        """Where this actor runs: node id, host, pid, the resources Ray assigned it, its GPUs, its run directory."""
        return {**ray_placement.here(), "run_dir": self._topo_run_dir}

    def topo_files(self, known: dict[str, tuple[int, int, int]], remove: bool = False
                   ) -> list[tuple[str, int, int, bytes, int, int]]:
        """The files of this node's run directory that ``known`` (relative path -> (mtime_ns, size, inode), what the
        trainer holds) lacks or holds older, as (relative path, mtime_ns, size, content, offset, inode): an append-only
        record (:func:`~.ray_records.appended`) that grew in place sends only its new bytes, from ``offset``; any other
        file, or one rewritten since (another inode: retention), whole (offset 0), and every beats file (small; its
        mtime moves only when the kernel writes its pages back). ``remove``: then delete the directory (the run is
        over on this node).
        Stateless here: an answer the trainer never read loses nothing."""
        out = node_files(self._topo_run_dir, known)
        if remove and self._topo_run_dir.startswith(os.path.join(tempfile.gettempdir(), NODE_RUNS)):
            shutil.rmtree(self._topo_run_dir, ignore_errors=True)
        return out
