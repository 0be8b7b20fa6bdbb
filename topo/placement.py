"""Placement: where each subcollector runs (this machine, or a Ray actor with resources), checked on paper.

Pure: the per-subcollector resource requests, the Ray ``remote_configs`` they become, and a
first-fit-decreasing packing onto the nodes a spec declares, so that a placement no cluster could
satisfy fails at ``topo validate`` rather than hanging at launch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .diagnostics import Diagnostic, error, ids_text, warning
from .spec import Node, Request, Spec

GB = 1024**3


@dataclass(frozen=True)
class Resources:
    cpus: float = 1
    gpus: float = 0
    memory_gb: float | None = None
    custom: tuple[tuple[str, float], ...] = ()

    @classmethod
    def merge(cls, base: "Resources", request: Request) -> "Resources":
        """``base`` with what ``request`` writes."""
        return cls(base.cpus if request.cpus is None else request.cpus,
                   base.gpus if request.gpus is None else request.gpus,
                   base.memory_gb if request.memory_gb is None else request.memory_gb,
                   tuple(sorted({**dict(base.custom), **request.custom}.items())))

    def to_dict(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "gpus": self.gpus, "memory_gb": self.memory_gb, "custom": dict(self.custom)}

    def remote_config(self) -> dict[str, Any]:
        """The kwargs of ``ray.remote(...)`` (torchrl ``RayCollector(remote_configs=[...])``)."""
        config: dict[str, Any] = {"num_cpus": self.cpus, "num_gpus": self.gpus}
        if self.memory_gb is not None:
            config["memory"] = int(self.memory_gb * GB)
        if self.custom:
            config["resources"] = dict(self.custom)
        return config


def fits(node: Node, r: Resources, used: Mapping[str, float]) -> bool:
    """Whether ``r`` fits on ``node`` beside what is ``used`` there already."""
    need = {"cpus": r.cpus, "gpus": r.gpus, "memory_gb": r.memory_gb or 0, **dict(r.custom)}
    for key, amount in need.items():
        cap = node.capacity(key)
        if amount and cap is not None and used.get(key, 0) + amount > cap + 1e-9:
            return False
    return True


def resources(spec: Spec) -> list[Resources]:
    """Each subcollector's request: the default, then overrides in order."""
    base = Resources.merge(Resources(), spec.placement.resources)
    out = [base] * spec.subcollectors
    for override in spec.placement.overrides:
        for c in override.subcollectors:
            if 0 <= c < spec.subcollectors:
                out[c] = Resources.merge(out[c], override.resources)
    return out


def pack(requests: list[Resources], kinds: tuple[Node, ...]) -> list[str | None]:
    """First-fit decreasing: the node (``name#i``) each subcollector lands on, None where none fits."""
    slots = [(kind, i) for kind in kinds for i in range(kind.count)]
    used: list[dict[str, float]] = [{} for _ in slots]
    order = sorted(range(len(requests)), key=lambda c: (-requests[c].gpus, -requests[c].cpus, c))
    where: list[str | None] = [None] * len(requests)
    for c in order:
        r = requests[c]
        for s, (kind, i) in enumerate(slots):
            if fits(kind, r, used[s]):
                for key, amount in {"cpus": r.cpus, "gpus": r.gpus, "memory_gb": r.memory_gb or 0, **dict(r.custom)}.items():
                    used[s][key] = used[s].get(key, 0) + amount
                where[c] = f"{kind.name}#{i}" if kind.count > 1 else kind.name
                break
    return where


def plan_section(spec: Spec) -> dict[str, Any]:
    """The placement part of a plan: engine, address, runtime_env, and per subcollector its request and node."""
    placement = spec.placement
    requests = resources(spec)
    where = pack(requests, placement.nodes) if placement.nodes else [None] * len(requests)
    return {
        "engine": placement.engine,
        "address": placement.address,
        "runtime_env": placement.runtime_env,
        "subcollectors": [{"resources": r.to_dict(), "remote_config": r.remote_config(), "node": n}
                          for r, n in zip(requests, where)],
    }


def check(spec: Spec, memory_per_worker_gb: float | None) -> list[Diagnostic]:
    if not spec.wrote("placement"):
        return []
    path = ("placement",)
    out: list[Diagnostic] = []
    if spec.placement.engine == "local":
        extra = sorted({p[1] for p in spec.written if len(p) == 2 and p[0] == "placement"} - {"engine"})
        if extra:
            out.append(warning("placement-ignored", f"engine 'local' ignores {', '.join(extra)}", path + (extra[0],),
                               "set engine: ray to place subcollectors on a cluster"))
        return out
    for i, override in enumerate(spec.placement.overrides):
        bad = [c for c in override.subcollectors if not 0 <= c < spec.subcollectors]
        if bad:
            out.append(error("placement-unknown-subcollector", f"override {i} names subcollector(s) {bad}, but there are "
                             f"{spec.subcollectors} (0-{spec.subcollectors - 1})", path + ("overrides", i, "subcollectors"),
                             f"use indices 0-{spec.subcollectors - 1}"))
    requests = resources(spec)
    kinds = spec.placement.nodes
    found: dict[tuple, list[int]] = {}  # the same problem in several subcollectors is one diagnostic

    def add(make, code, message, where, hint, c):
        found.setdefault((make, code, message, where, hint), []).append(c)

    for c, r in enumerate(requests):
        gpu = spec.render_gpus[c % len(spec.render_gpus)] if spec.render_gpus else None
        where = _resource_path(spec, c)
        if gpu is not None and spec.render_numbering == "cuda" and r.gpus < gpu + 1:  # EGL ids count the node's devices
            add(error, "placement-render-gpu-not-visible",
                f"{{who}} {{renders}} on GPU {gpu} but {{asks}} for {r.gpus:g} GPU(s); a Ray actor sees only its own "
                f"GPUs, numbered from 0 (it needs gpus >= {gpu + 1})",
                where + ("gpus",), "ask for GPUs in placement.resources, and use render_gpus: [0] for one GPU per actor", c)
        m = spec.workers[c]
        if r.cpus < 1:
            add(error, "placement-cpus", f"{{who}} {{asks}} for {r.cpus:g} CPUs; an actor process needs at least 1",
                where + ("cpus",), f"ask for {m + 1} CPUs ({m} workers + the subcollector)", c)
        elif r.cpus < m + 1:
            add(warning, "placement-cpus-oversubscribed", f"{{who}} {{runs}} {m} worker processes + 1 on {r.cpus:g} "
                f"CPU(s) ({(m + 1) / r.cpus:.1f} processes per CPU)", where + ("cpus",),
                f"ask for {m + 1} CPUs, or accept the contention", c)
        if memory_per_worker_gb and r.memory_gb is not None and r.memory_gb < m * memory_per_worker_gb:
            add(warning, "placement-memory", f"{{who}} {{asks}} for {r.memory_gb:g} GB for {m} workers x "
                f"~{memory_per_worker_gb:g} GB = {m * memory_per_worker_gb:g} GB", where + ("memory_gb",),
                f"ask for at least {m * memory_per_worker_gb:g} GB", c)
        if kinds and not any(fits(kind, r, {}) for kind in kinds):
            add(error, "placement-unsatisfiable", f"{{who}} {{asks}} for {_describe(r)}, more than any declared node "
                f"has ({_shortfall(r, kinds)})", where, "ask for less, or declare a larger node", c)
    for (make, code, message, where, hint), subs in found.items():
        who = f"subcollector {subs[0]}" if len(subs) == 1 else f"subcollectors {ids_text(subs)}"
        one = len(subs) == 1
        verbs = {verb: verb + "s" if one else verb for verb in ("ask", "render", "run")}
        out.append(make(code, message.format(who=who, asks=verbs["ask"], renders=verbs["render"], runs=verbs["run"]),
                        where, hint))
    if kinds:
        out += _paper_check(spec, requests, kinds)
    return out


def _paper_check(spec: Spec, requests: list[Resources], kinds: tuple[Node, ...]) -> list[Diagnostic]:
    """Every request fits some node alone; do they fit all together?"""
    out = []
    path = ("placement", "nodes")
    if not all(any(fits(kind, r, {}) for kind in kinds) for r in requests):
        return out
    where = pack(requests, kinds)
    homeless = [c for c, n in enumerate(where) if n is None]
    if homeless:
        keys = ["cpus", "gpus", "memory_gb"] + sorted({k for r in requests for k, _ in r.custom})
        total = {key: sum(_amount(r, key) for r in requests) for key in keys}
        cap = {key: sum((kind.capacity(key) or 0) * kind.count for kind in kinds) for key in keys}
        arithmetic = ", ".join(f"{key} {total[key]:g} asked / {cap[key]:g} declared" for key in keys if total[key])
        out.append(error("placement-unsatisfiable", f"subcollector(s) {ids_text(homeless)} fit on no node once the others "
                         f"are placed ({arithmetic})", path, "declare more nodes, or ask for less per subcollector"))
    return out


def _amount(r: Resources, key: str) -> float:
    if key in ("cpus", "gpus", "memory_gb"):
        return getattr(r, key) or 0
    return dict(r.custom).get(key, 0)


def _shortfall(r: Resources, kinds: tuple[Node, ...]) -> str:
    best = max(kinds, key=lambda k: ((k.gpus or 0) >= r.gpus, k.cpus or 0))
    parts = []
    for key, amount in (("cpus", r.cpus), ("gpus", r.gpus), ("memory_gb", r.memory_gb or 0), *r.custom):
        cap = best.capacity(key)
        if amount and cap is not None and amount > cap:
            parts.append(f"{key} {amount:g} > {cap:g} on {best.name}")
    return "; ".join(parts) or "no single node has all of it"


def _describe(r: Resources) -> str:
    text = f"{r.cpus:g} CPUs, {r.gpus:g} GPUs"
    if r.memory_gb is not None:
        text += f", {r.memory_gb:g} GB"
    for key, amount in r.custom:
        text += f", {key} {amount:g}"
    return text


def _resource_path(spec: Spec, c: int) -> tuple:
    for i, override in enumerate(spec.placement.overrides):
        if c in override.subcollectors:
            return ("placement", "overrides", i, "resources")
    return ("placement", "resources")
