"""What the supervisor knows of a running launch, rebuilt from run-directory markers and events."""
from __future__ import annotations

import enum
import os
import time
from dataclasses import dataclass, field
from typing import Any

from . import processes
from .markers import HOST, RunDir


class Phase(enum.Enum):
    STARTING = "starting"
    COLLECTING = "collecting"
    SHUTTING_DOWN = "shutting down"
    DONE = "done"


@dataclass
class Worker:
    """One env worker of the plan, as its markers describe it."""

    subcollector: int
    index: int
    row: dict
    pid: int | None = None
    started: float | None = None
    constructed: float | None = None
    closed: float | None = None
    failed: str | None = None  # the builder's traceback
    seed: Any = None
    render_device: dict | None = None  # what the builder resolved (GL backend, CUDA and EGL device, renderer)
    inherited_gl: list[str] = field(default_factory=list)  # GL/CUDA libraries mapped before the builder ran
    build_s: float | None = None
    close_s: float | None = None
    constructions: list[tuple[int, float]] = field(default_factory=list)  # (pid, time), one expected
    closes: int = 0


class LaunchState:
    """Workers, subcollectors, collector-process events and tracked processes of one launch."""

    def __init__(self, plan: dict, run: RunDir, started: float):
        self.plan = plan
        self.run = run
        self.t0 = started
        self.phase = Phase.STARTING
        self.workers = {(sub["index"], row["index"]): Worker(sub["index"], row["index"], row)
                        for sub in plan["subcollectors"] for row in sub["workers"]}
        self.subcollector_pids: dict[int, int] = {}
        self.subcollector_start_methods: dict[int, str] = {}  # how each subcollector process was started
        self.subcollector_up: dict[int, float] = {}  # when each subcollector, imports done, asked for its env workers
        self.events: dict[str, dict] = {}
        self.batches: list[dict] = []
        self.tracked = processes.Tracked()
        self.runner_pid: int | None = None
        self.peak_descendants = 0
        self._dead_since: dict[int, float] = {}

    def update(self) -> None:
        """Read new markers and events; sample the process tree."""
        for m in self.run.read_new("markers"):
            self._marker(m)
        for e in self.run.read_new("events"):
            if e["name"] == "batch":
                self.batches.extend(e["observed"])
            self.events.setdefault(e["name"], e)
        if "ready" in self.events and self.phase is Phase.STARTING:
            self.phase = Phase.COLLECTING
        if "collected" in self.events and self.phase is Phase.COLLECTING:
            self.phase = Phase.SHUTTING_DOWN
        if self.runner_pid is not None:
            tree = processes.descendants(os.getpid())
            self.peak_descendants = max(self.peak_descendants, len(tree))
            for pid in tree:
                self.tracked.add(pid, "other")

    def _marker(self, m: dict) -> None:
        local = m.get("host", HOST) == HOST  # a Ray actor or worker on another node: not tracked by pid here
        if m["name"] == "subcollector":
            self.subcollector_pids.setdefault(m["index"], m["pid"])
            self.subcollector_start_methods.setdefault(m["index"], m["start_method"])
            self.subcollector_up.setdefault(m["index"], m["time"])
            if local:
                self.tracked.add(m["pid"], "subcollector")
            return
        w = self.workers.get((m["worker"].get("subcollector"), m["worker"].get("index")))
        if w is None:
            return
        if m["name"] == "started":
            w.pid, w.started, w.inherited_gl = m["pid"], m["time"], m.get("inherited_gl") or []
            if local:
                self.tracked.add(m["pid"], "worker")
        elif m["name"] == "constructed":
            w.constructed, w.seed, w.build_s = m["time"], m["seed"], m["seconds"]
            w.render_device = m.get("render_device")
            w.constructions.append((m["pid"], m["time"]))
        elif m["name"] == "failed":
            w.failed = m["traceback"]
        elif m["name"] == "closed":
            w.closed, w.close_s = m["time"], m["seconds"]
            w.closes += 1

    def role_of(self, pid: int) -> str:
        """Role of the process that built an env: top, collector, subcollector or worker."""
        if pid == os.getpid():
            return "top"
        if pid == self.runner_pid:
            return "collector"
        if pid in self.subcollector_pids.values():
            return "subcollector"
        return "worker"

    def died_at(self, pid: int) -> float | None:
        """When ``pid`` was first seen dead (None while alive, or not tracked here); stamped on each call."""
        if pid not in self.tracked.procs or self.tracked.is_alive(pid):
            return None
        return self._dead_since.setdefault(pid, time.time())

    def not_ready(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.constructed is None]

    def elapsed(self, at: float | None = None) -> float:
        return (at if at is not None else time.time()) - self.t0
