"""Placement: where each subcollector runs (this machine, or a Ray actor with resources), and under Ray the
inference server's actor (``policy.placement: server``).

Pure: the per-actor resource requests, the Ray ``remote_configs`` they become, and a
first-fit-decreasing packing onto the nodes a spec declares (which :mod:`topo.compiler.rules.placement` checks
on paper, so that a placement no cluster could satisfy fails at ``topo validate`` rather than hanging
at launch).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from topo.compiler.spec import Node, Request, Spec

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


def serves_on_ray(spec: Spec) -> bool:
    """Whether the plan has an inference server actor: ``policy.placement: server`` under engine ray."""
    return spec.placement.engine == "ray" and spec.policy is not None and spec.policy.placement == "server"


def server_resources(spec: Spec) -> Resources:
    """The inference server actor's request: 1 CPU by default, then what placement.server writes."""
    return Resources.merge(Resources(), spec.placement.server)


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


def requests_with_server(spec: Spec) -> list[Resources]:
    """Every actor's request: the subcollectors', then the inference server's when it is one."""
    return resources(spec) + ([server_resources(spec)] if serves_on_ray(spec) else [])


def plan_section(spec: Spec) -> dict[str, Any]:
    """The placement part of a plan: engine, address, runtime_env, run_dir, per subcollector its request and
    node, the inference server's (None unless it is a Ray actor), and under Ray the default request."""
    placement = spec.placement
    requests = requests_with_server(spec)
    where = pack(requests, placement.nodes) if placement.nodes else [None] * len(requests)
    placed = [_placed(r, n) for r, n in zip(requests, where)]
    return {
        "engine": placement.engine,
        "address": placement.address,
        "runtime_env": placement.runtime_env,
        "run_dir": placement.run_dir,
        "subcollectors": placed[:spec.subcollectors],
        "server": placed[spec.subcollectors] if serves_on_ray(spec) else None,
        # what an actor no override names asks for: each eval subcollector's, under Ray (topo.launch.evaluate)
        "default": _placed(Resources.merge(Resources(), placement.resources), None) if placement.engine == "ray" else None,
    }


def _placed(r: Resources, node: str | None) -> dict[str, Any]:
    return {"resources": r.to_dict(), "remote_config": r.remote_config(), "node": node}
