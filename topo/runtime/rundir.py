"""The run directory: records that a run's processes write, and the start-slot semaphore.

A run sets ``TOPO_RUN_DIR`` (and ``TOPO_MAX_CONCURRENT_STARTS`` when opted in) in the environment of
the processes it starts; subcollectors, the policy server and env workers inherit it, so the plan
kwargs stay exact. Each record is one small JSON file, written atomically: ``markers/`` (one file per
event of a process: started, constructed, failed, closed...) and ``observed/`` (one file per
subcollector, replaced at each of its batches). The monitor reads progress
and failures from them and the report counts constructions and closes from them.
Imports neither torch nor torchrl: env workers, the watcher and the CLI all read it.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import uuid
from typing import Any, Iterator

#: the roles a process of a run has, in the order a report lists them (an env built in any but a worker is
#: what worker metadata removes)
ROLES = ("trainer", "server", "subcollector", "worker")

RUN_DIR_VAR = "TOPO_RUN_DIR"
SLOTS_VAR = "TOPO_MAX_CONCURRENT_STARTS"
RESTART_VAR = "TOPO_RESTART"  # set in the processes of a restarted subcollector: its restart number
HOST = socket.gethostname()  # a pid means something only on the host that wrote it (Ray nodes)
NODE_VAR = "TOPO_NODE"  # in a Ray actor's processes: its node id, cut to 12 characters (two nodes may share a host)


class RunDir:
    """Writer and reader of a run directory's records."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        self._seen: set[str] = set()

    @classmethod
    def current(cls) -> RunDir | None:
        """The run directory of the run this process belongs to, or None outside a topo run."""
        path = os.environ.get(RUN_DIR_VAR)
        return cls(path) if path else None

    def write(self, folder: str, name: str, **fields: Any) -> None:
        """Atomically write this process's record ``name`` (:func:`record`) as a new file under ``folder``."""
        self.add(folder, record(name, **fields))

    def add(self, folder: str, made: dict) -> None:
        """Atomically write a record another process made (:func:`record`: a Ray actor's), as it made it."""
        self._dump(folder, f"{made['name']}.{made['pid']}.{uuid.uuid4().hex[:8]}.json", made)

    def put(self, folder: str, name: str, **fields: Any) -> None:
        """Atomically replace ``folder/name.json`` with ``{name, pid, host, time, restart, **fields}``."""
        self._dump(folder, f"{name}.json", {"name": name, "pid": os.getpid(), "host": HOST, **_node(),
                                                "time": time.time(), "restart": restart_number(), **fields})

    def _dump(self, folder: str, file: str, record: dict) -> None:
        where = os.path.join(self.path, folder)
        os.makedirs(where, exist_ok=True)
        final = os.path.join(where, file)
        tmp = f"{final}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, final)

    def read_all(self, folder: str) -> list[dict]:
        """Every record under ``folder``, oldest first (for ``put`` records: their latest version)."""
        where = os.path.join(self.path, folder)
        if not os.path.isdir(where):
            return []
        out = []
        for entry in os.scandir(where):
            if entry.name.endswith(".json"):
                try:
                    with open(entry.path) as f:
                        out.append(json.load(f))
                except (OSError, ValueError):  # replaced or removed while listed
                    continue
        return sorted(out, key=lambda r: r["time"])

    def marker(self, name: str, **fields: Any) -> None:
        self.write("markers", name, **fields)

    def read_new(self, folder: str) -> list[dict]:
        """Records under ``folder`` not returned by an earlier call, oldest first."""
        where = os.path.join(self.path, folder)
        if not os.path.isdir(where):
            return []
        fresh = []
        for entry in os.scandir(where):
            if entry.name.endswith(".json") and entry.path not in self._seen:
                self._seen.add(entry.path)
                with open(entry.path) as f:
                    fresh.append(json.load(f))
        return sorted(fresh, key=lambda r: r["time"])

    @contextlib.contextmanager
    def start_slot(self) -> Iterator[None]:
        """Hold one of ``TOPO_MAX_CONCURRENT_STARTS`` file-lock slots (no limit when unset).

        ``flock`` locks die with their process, so a crashed worker never leaks a slot.
        """
        slots = int(os.environ.get(SLOTS_VAR) or 0)
        if slots <= 0:
            yield
            return
        where = os.path.join(self.path, "slots")
        os.makedirs(where, exist_ok=True)
        files = [open(os.path.join(where, f"slot-{i}.lock"), "a") for i in range(slots)]
        try:
            while not any(_try_lock(f) for f in files):
                time.sleep(0.05)
            yield
        finally:
            for f in files:
                f.close()  # closing releases the lock


EVAL_ROUND = "eval_round"  # the file in a run directory that holds the evaluation round (:func:`set_eval_round`)


def eval_round(run: RunDir) -> int:
    """The evaluation round in ``run``: N while round N runs, -N once it ended, 0 before the first; read at each
    eval reset."""
    try:
        with open(os.path.join(run.path, EVAL_ROUND)) as f:
            return int(f.read() or 0)
    except (OSError, ValueError):
        return 0


def set_eval_round(run: RunDir, number: int) -> None:
    """Round ``number`` starts (every eval worker runs its episodes again from its next reset on), or, negative,
    round ``-number`` ended (none runs an episode until the next starts: an eval worker restarted between rounds
    waits for the next, rather than running the last one's episodes again)."""
    tmp = os.path.join(run.path, EVAL_ROUND + ".tmp")
    with open(tmp, "w") as f:
        f.write(str(number))
    os.replace(tmp, os.path.join(run.path, EVAL_ROUND))


def record(name: str, **fields: Any) -> dict:
    """This process's record ``name``: ``{name, pid, ppid, host, [node,] time, restart, **fields}``."""
    return {"name": name, "pid": os.getpid(), "ppid": os.getppid(), "host": HOST, **_node(), "time": time.time(),
            "restart": restart_number(), **fields}


def _node() -> dict[str, str]:
    """``{"node": id}`` in a Ray actor's processes (:data:`NODE_VAR`), else nothing."""
    node = os.environ.get(NODE_VAR)
    return {"node": node} if node else {}


def restart_number() -> int:
    """0 in the processes a run started first; k in those of a subcollector's k-th restart (and its workers)."""
    return int(os.environ.get(RESTART_VAR) or 0)


def _try_lock(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def record_close(env: Any, run: RunDir, worker: dict) -> None:
    """Make ``env.close()`` write a ``closed`` marker after it returns (an instance attribute, no subclass)."""
    original = env.close

    def close(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            run.marker("closed", worker=worker, seconds=time.monotonic() - started)
            env.__dict__.pop("close", None)  # close once; later calls (``__del__``) go to the class

    env.close = close
