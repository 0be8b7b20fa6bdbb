"""A mode's lower bound on time to ready, from one worker's phases: imports no torch (``topo plan --estimate``
reads it too).

The lower bound of a mode is what its process structure cannot go below on ``cores`` cores, given one
worker's phases measured alone (:mod:`.single`): ``shared`` (process start + imports of torch, torchrl.envs
and the builder: paid once per process that imports them), ``construct`` and ``reset`` (paid by every
worker, never shared), and on a cold cache one ``compile`` (the first worker of a scene compiles it while
the others wait for it). Per mode, with N workers in S subcollectors (at most M in one):

- importing processes: S subcollectors, plus N workers (``legacy``, ``homogeneous``, ``workers``, ``capped``,
  ``forkserver``: each worker imports) or none (``fork``); ``forkserver-preload``: the run's one forkserver, which
  every subcollector and worker is forked from;
- parent envs: N (``legacy``), S (``homogeneous``), else 0, each one construction, M (or 1) of them one
  after another in a subcollector before its workers start;
- work = importing processes x shared + N x (construct + reset) + parent envs x construct (+ compile), in
  CPU seconds (a software renderer may spread one worker's phase over several cores);
- chain = shared (a subcollector; the run's forkserver for ``forkserver-preload``) + its serial parent envs x
  construct + shared (the worker's own imports; none when forked) + construct + reset (+ compile);
- bound = max(chain, work / cores); ``capped`` also at least N x construct / cap (constructions hold a slot).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shape:
    """The topology a bound is computed for."""

    workers: int
    subcollectors: int
    most_per_subcollector: int

    @classmethod
    def of(cls, plan: dict[str, Any]) -> "Shape":
        counts = [s["num_workers"] for s in plan["subcollectors"]]
        return cls(sum(counts), len(counts), max(counts))


@dataclass(frozen=True)
class Costs:
    """One worker alone, medians in seconds (see the module); ``cpu``: the same phases in CPU seconds of all
    the process's threads, what the work counts (None: as the wall times)."""

    shared: float
    construct: float
    reset: float
    compile: float = 0.0
    cpu: "Costs | None" = None

    def as_dict(self) -> dict[str, Any]:
        out = {k: round(v, 3) for k, v in vars(self).items() if k != "cpu"}
        return {**out, "cpu": None if self.cpu is None else self.cpu.as_dict()}


def lower_bound(mode: str, shape: Shape, costs: Costs, cores: int, *, cold: bool = False,
                cap: int | None = None) -> dict[str, Any]:
    """The lower bound of ``mode`` (see the module): ``s``, and the ``chain_s``, ``work_s`` it comes from."""
    n, s = shape.workers, shape.subcollectors
    importers = 1 if mode == "forkserver-preload" else s + (0 if mode == "fork" else n)
    parents = {"legacy": n, "homogeneous": s}.get(mode, 0)
    serial = {"legacy": shape.most_per_subcollector, "homogeneous": 1}.get(mode, 0)
    cpu = costs.cpu or costs
    work = (importers * cpu.shared + n * (cpu.construct + cpu.reset) + parents * cpu.construct
            + (cpu.compile if cold else 0.0))
    forked = mode in ("fork", "forkserver-preload")
    chain = (costs.shared + serial * costs.construct + (0.0 if forked else costs.shared) + costs.construct
             + costs.reset + (costs.compile if cold else 0.0))
    bound = max(chain, work / max(cores, 1))
    if mode == "capped" and cap:
        bound = max(bound, n * cpu.construct / cap)
    return {"s": round(bound, 3), "chain_s": round(chain, 3), "work_s": round(work, 3),
            "importing_processes": importers, "parent_envs": parents}
