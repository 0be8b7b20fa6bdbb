"""What a run knows of its processes, rebuilt from run-directory records and the deaths it saw.

A restarted subcollector is a new generation: :meth:`RunState.retire` moves the subcollector, its
workers and its policy copy aside (``retired``) and puts fresh ones, numbered ``restart + 1``, in their
place. Records carry the restart number of the process that wrote them, so a late record of a retired
process (a close, a death) lands on it and never on its successor.
"""
from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any

from topo.runtime import heartbeat
from topo.compiler.plan import engine
from topo.runtime.rundir import HOST, RunDir
from topo.launch.supervision.processes import Death
from topo.launch.supervision.lives import life_plan
from topo.compiler.row import Row


class Phase(enum.Enum):
    """A run's lifecycle: each phase is entered once, in this order."""

    STARTING = "starting"
    COLLECTING = "collecting"
    SHUTTING_DOWN = "shutting down"
    DONE = "done"


@dataclass
class Worker:
    """One env worker of the plan, as its markers describe it."""

    subcollector: int
    index: int
    row: Row
    pid: int | None = None
    local: bool = True  # on this host (under a Ray actor, maybe not)
    started: float | None = None
    constructed: float | None = None
    closed: float | None = None
    failed: str | None = None  # the builder's traceback
    failed_at: float | None = None
    seed: Any = None
    render_device: dict | None = None  # what the builder resolved (GL backend, CUDA and EGL device, renderer)
    inherited_gl: list[str] = field(default_factory=list)  # GL/CUDA libraries mapped before the builder ran
    build_s: float | None = None
    close_s: float | None = None
    constructions: list[tuple[int, float]] = field(default_factory=list)  # (pid, time), one expected
    closes: int = 0
    died: Death | None = None
    restart: int = 0  # the subcollector's restart this worker belongs to (0: the first start)

    @property
    def name(self) -> str:
        return f"sub{self.subcollector}/w{self.index}"


@dataclass
class Subcollector:
    """One subcollector process (or Ray actor), as its marker and its batches describe it."""

    index: int
    pid: int | None = None
    local: bool = True  # on this host (a Ray actor may not be)
    start_method: str | None = None
    up: float | None = None  # imports done, asking for its env workers
    built_elsewhere: list[int] = field(default_factory=list)  # other pids that built its ParallelEnv (the trainer)
    observed: dict | None = None  # its latest ``observed/`` record
    died: Death | None = None
    restart: int = 0  # its worker life: the run's first life for its first start (0 unless resumed), then one more a restart
    first: bool = True  # the run's first start of it (not a restart or a recycle)
    pending: bool = False  # decided, not yet started: the trainer starts it at its next call into the collector
    began: float | None = None  # a restart's process started (the first start: the run's t0)
    ready: float | None = None  # a restart collects (its envs built, its policy connected)


@dataclass
class PolicyProcess:
    """Where a policy was built: the server, or one subcollector's copy."""

    role: str  # "server" or "subcollector"
    pid: int
    subcollector: int | None = None
    failed: str | None = None  # the factory's traceback
    at: float = 0.0
    died: Death | None = None
    restart: int = 0


class RunState:
    """Workers, subcollectors, policies and deaths of one run, keyed as the plan keys them."""

    def __init__(self, plan: dict, run: RunDir, started: float, trainer_pid: int | None = None, first_life: int = 0):
        """``first_life``: the worker life the run's first start is (a resumed run's: after the lives before it)."""
        self.plan = plan
        self.run = run
        self.t0 = started
        self.trainer_pid = trainer_pid if trainer_pid is not None else os.getpid()
        # under Ray each actor watches its own env workers and names the dead and the hung (:mod:`.ray_node`),
        # on this host as on any other: their pids are not watched here
        self.watch_workers = engine(plan) != "ray"
        self.phase = Phase.STARTING
        self.workers = {(sub["index"], row["index"]): Worker(sub["index"], row["index"], row, restart=first_life)
                        for sub in life_plan(plan, first_life)["subcollectors"] for row in sub["workers"]}
        self.subcollectors = {sub["index"]: Subcollector(sub["index"], restart=first_life)
                              for sub in plan["subcollectors"]}
        self.policies: list[PolicyProcess] = []
        self.deaths: dict[int, Death] = {}
        self.retired_workers: list[Worker] = []
        self.retired_subcollectors: list[Subcollector] = []
        self.restarts: list = []  # recovery.Restart, in the order they were decided
        self.recycles: list = []  # recycle.Recycle (health budgets), in the order they were decided
        # pids that ended because a peer died (topo.runtime.quiet): a consequence, never the failure named
        self.ended_by_peer: set[int] = set()
        self.stacks: list[int] = []  # pids that built an env.transforms stack over an env (one per build)
        self._new_pids: list[tuple[int, float]] = []

    # -- reading records ------------------------------------------------------------------------
    def update(self) -> None:
        """Read new markers, the processes a peer's death ended, and every subcollector's latest batch record (one
        per restart)."""
        for m in self.run.read_new("markers"):
            self._marker(m)
        self.ended_by_peer.update(r["pid"] for r in self.run.read_new("tracebacks"))
        for record in self.run.read_all("observed"):
            sub = self.subcollector(record.get("subcollector"), record.get("restart", 0))
            if sub is not None:
                sub.observed = record

    def subcollector(self, index: int | None, restart: int = 0) -> Subcollector | None:
        """Subcollector ``index`` as its ``restart``-th start, current or retired."""
        sub = self.subcollectors.get(index)
        if sub is None or sub.restart == restart:
            return sub
        return next((s for s in self.retired_subcollectors if (s.index, s.restart) == (index, restart)), None)

    def worker(self, subcollector: int | None, index: int | None, restart: int = 0) -> Worker | None:
        w = self.workers.get((subcollector, index))
        if w is None or w.restart == restart:
            return w
        return next((r for r in self.retired_workers if (r.subcollector, r.index, r.restart) == (subcollector, index,
                                                                                                  restart)), None)

    def _marker(self, m: dict) -> None:
        local = m.get("host", HOST) == HOST  # a Ray actor or worker on another node: not watched by pid here
        name, restart = m["name"], m.get("restart", 0)
        if name == "subcollector":
            sub = self.subcollector(m["index"], restart)
            if sub is None:
                return
            if sub.pid is None and m["pid"] != self.trainer_pid:
                sub.pid, sub.local, sub.start_method, sub.up = m["pid"], local, m["start_method"], m["time"]
                self._watch(m["pid"], m["time"], local)
            elif m["pid"] != sub.pid:
                sub.built_elsewhere.append(m["pid"])
            return
        if name == "transforms":  # a subcollector's stack over its ParallelEnv
            self.stacks.append(m["pid"])
            return
        if name in ("policy", "server", "policy-failed"):
            role = "server" if name == "server" or m.get("role") == "server" else "subcollector"
            self.policies.append(PolicyProcess(role, m["pid"], m.get("subcollector"), m.get("traceback"), m["time"],
                                               restart=restart))
            if name != "policy-failed":
                self._watch(m["pid"], m["time"], local)
            return
        w = self.worker(m["worker"].get("subcollector"), m["worker"].get("index"), restart)
        if w is None:
            return
        if name == "started":
            w.pid, w.local, w.started, w.inherited_gl = m["pid"], local, m["time"], m.get("inherited_gl") or []
            self._watch(m["pid"], m["time"], local and self.watch_workers)
        elif name == "constructed":
            w.constructed, w.seed, w.build_s = m["time"], m["seed"], m["seconds"]
            w.render_device = m.get("render_device")
            w.constructions.append((m["pid"], m["time"]))
            if m.get("transforms"):
                self.stacks.append(m["pid"])
        elif name == "failed":
            w.failed, w.failed_at = m["traceback"], m["time"]
        elif name == "closed":
            w.closed, w.close_s = m["time"], m["seconds"]
            w.closes += 1

    def _watch(self, pid: int, alive_at: float, local: bool) -> None:
        if local and pid != self.trainer_pid:
            self._new_pids.append((pid, alive_at))

    # -- deaths ---------------------------------------------------------------------------------
    def pids_to_watch(self) -> list[tuple[int, float]]:
        """(pid, time it was last known alive) learnt from markers since the last call (the monitor watches each)."""
        out, self._new_pids = self._new_pids, []
        return out

    def record_death(self, death: Death) -> None:
        self.deaths.setdefault(death.pid, death)
        for w in self.all_workers():
            if w.pid == death.pid and w.died is None:
                w.died = death
        for sub in self.all_subcollectors():
            if sub.pid == death.pid and sub.died is None:
                sub.died = death
        for p in self.policies:
            if p.pid == death.pid and p.died is None:
                p.died = death

    # -- restarts -------------------------------------------------------------------------------
    def retire(self, index: int, rows: list[Row]) -> Subcollector:
        """Set subcollector ``index`` and its workers aside; their successors, with ``rows``, take their place
        (after a failure, a restart; past a health budget, a recycle: either is the next start)."""
        old = self.subcollectors[index]
        self.retired_subcollectors.append(old)
        new = Subcollector(index, restart=old.restart + 1, first=False, pending=True)
        self.subcollectors[index] = new
        for row in rows:
            self.retired_workers.append(self.workers[(index, row["index"])])
            self.workers[(index, row["index"])] = Worker(index, row["index"], row, restart=new.restart)
        return new

    def all_workers(self) -> list[Worker]:
        """Every worker of the run, retired ones (of subcollectors since restarted) first."""
        return [*self.retired_workers, *self.workers.values()]

    def all_subcollectors(self) -> list[Subcollector]:
        return [*self.retired_subcollectors, *self.subcollectors.values()]

    def retired_subcollectors_of(self, index: int) -> list[Subcollector]:
        return [s for s in self.retired_subcollectors if s.index == index]

    def current_policies(self) -> list[PolicyProcess]:
        """The server, and each subcollector's copy as it was built by its current start."""
        return [p for p in self.policies if p.role == "server" or
                (p.subcollector in self.subcollectors and p.restart == self.subcollectors[p.subcollector].restart)]

    # -- questions ------------------------------------------------------------------------------
    def role_of(self, pid: int) -> str:
        """Role of a process that built something: trainer, server, subcollector or worker."""
        if pid == self.trainer_pid:
            return "trainer"
        if any(p.role == "server" and p.pid == pid for p in self.policies):
            return "server"
        if any(sub.pid == pid for sub in self.all_subcollectors()):
            return "subcollector"
        return "worker"

    def server(self) -> PolicyProcess | None:
        return next((p for p in self.policies if p.role == "server" and not p.failed), None)

    def known_pids(self) -> set[int]:
        """Every local pid a record named: subcollectors, server, workers, retired ones included."""
        pids = {sub.pid for sub in self.all_subcollectors() if sub.pid and sub.local}
        pids |= {p.pid for p in self.policies}
        pids |= {w.pid for w in self.all_workers() if w.pid and w.local}
        pids.discard(self.trainer_pid)
        return pids

    def not_ready(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.constructed is None]

    def elapsed(self, at: float) -> float:
        return at - self.t0

    def memory(self) -> list[dict[str, Any]]:
        """Each current worker's latest resident memory, as its heartbeat slot holds it
        (:func:`topo.runtime.heartbeat.memory`): ``subcollector``, ``worker``, ``global_index``, ``restart``, ``pid``,
        ``rss_mb``, ``peak_rss_mb`` and ``at`` (the ``time.time()`` of the reading), the figures None until the
        worker read them (or when it runs on another host). Reads one small file per subcollector."""
        out = []
        for c, sub in sorted(self.subcollectors.items()):
            figures = heartbeat.memory(self.run.path, c, sub.restart) or []
            for w in sorted((w for w in self.workers.values() if w.subcollector == c), key=lambda w: w.index):
                m = figures[w.index] if w.index < len(figures) else None
                out.append({"subcollector": c, "worker": w.index, "global_index": w.row.get("global_index"),
                            "restart": w.restart, "pid": m.pid if m else w.pid,
                            "rss_mb": m.rss_mb if m else None, "peak_rss_mb": m.peak_rss_mb if m else None,
                            "at": m.at if m else None})
        return out
