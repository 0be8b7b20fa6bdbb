"""Rules on the placement section, checked on paper: what ``placement.engine: ray`` asks of the cluster."""
from __future__ import annotations

from topo.diagnostics import Diagnostic, error, ids_text, warning
from topo.compiler.placement import Resources, fits, pack, requests_with_server, resources, server_resources, serves_on_ray
from topo.compiler.spec import Node, Spec
from topo.compiler.rules.context import Context


def placement(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Ray placements that fit: overrides name real subcollectors, requests fit the workers and the declared nodes."""
    if not spec.wrote("placement"):
        return []
    memory_per_worker_gb = ctx.backend.memory_per_worker_gb if ctx.backend is not None else None
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
    if len(spec.workers) < spec.subcollectors:
        return out  # workers-list-length: some subcollectors have no worker count to check against
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
    if serves_on_ray(spec):
        out += _server(spec, kinds)
    elif spec.wrote("placement", "server"):
        out.append(warning("placement-server-ignored", "placement.server places the inference server's actor, but "
                           "policy.placement is not server: nothing uses it", ("placement", "server"),
                           "set policy.placement: server, or remove placement.server"))
    for (make, code, message, where, hint), subs in found.items():
        who = f"subcollector {subs[0]}" if len(subs) == 1 else f"subcollectors {ids_text(subs)}"
        one = len(subs) == 1
        verbs = {verb: verb + "s" if one else verb for verb in ("ask", "render", "run")}
        out.append(make(code, message.format(who=who, asks=verbs["ask"], renders=verbs["render"], runs=verbs["run"]),
                        where, hint))
    if kinds:
        out += _paper_check(spec, requests_with_server(spec), kinds)
    return out


def _server(spec: Spec, kinds: tuple[Node, ...]) -> list[Diagnostic]:
    """The inference server's actor: its policy device is one of its own GPUs; some declared node holds it."""
    r = server_resources(spec)
    where = ("placement", "server")
    out = []
    device = spec.policy.device or "cpu"
    if device.startswith("cuda"):
        index = int(device.partition(":")[2] or 0)
        if r.gpus < index + 1:
            out.append(error("placement-server-device-not-visible", f"the policy runs on {device} in the inference "
                             f"server's actor, which asks for {r.gpus:g} GPU(s); a Ray actor sees only its own GPUs, "
                             f"numbered from 0 (it needs gpus >= {index + 1})", where + ("gpus",),
                             "ask for gpus: 1 in placement.server, and use policy.device: cuda (its GPU 0)"))
    if kinds and not any(fits(kind, r, {}) for kind in kinds):
        out.append(error("placement-unsatisfiable", f"the inference server asks for {_describe(r)}, more than any "
                         f"declared node has ({_shortfall(r, kinds)})", where, "ask for less, or declare a larger node"))
    return out


def _paper_check(spec: Spec, requests: list[Resources], kinds: tuple[Node, ...]) -> list[Diagnostic]:
    """Every request fits some node alone; do they fit all together?"""
    if not all(any(fits(kind, r, {}) for kind in kinds) for r in requests):
        return []
    where = pack(requests, kinds)
    homeless = [c for c, n in enumerate(where) if n is None]
    if not homeless:
        return []
    subs = [c for c in homeless if c < spec.subcollectors]  # the last request may be the inference server's
    who = " and ".join(([f"subcollector(s) {ids_text(subs)}"] if subs else [])
                       + (["the inference server"] if spec.subcollectors in homeless else []))
    return [error("placement-unsatisfiable", f"{who} fit on no node once the others are placed "
                  f"({asked_and_declared(requests, kinds)})", ("placement", "nodes"),
                  "declare more nodes, or ask for less per subcollector")]


def eval_beside_training(spec: Spec, eval_actors: int) -> str | None:
    """Under Ray with declared nodes, where the training's actors fit: None when the eval run's ``eval_actors``
    (each asking for ``placement.resources``) and, with ``eval.policy: server``, its own inference server's actor
    fit beside them; else what is asked against what is declared."""
    kinds = spec.placement.nodes
    if spec.placement.engine != "ray" or not kinds or spec.eval is None:
        return None
    training = requests_with_server(spec)
    if None in pack(training, kinds):
        return None  # placement-unsatisfiable says so
    evaluation = [Resources.merge(Resources(), spec.placement.resources)] * eval_actors
    evaluation += [server_resources(spec)] if spec.eval.policy == "server" and serves_on_ray(spec) else []
    both = training + evaluation
    return None if None not in pack(both, kinds) else asked_and_declared(both, kinds)


def asked_and_declared(requests: list[Resources], kinds: tuple[Node, ...]) -> str:
    """``cpus 10 asked / 8 declared, ...``: each resource the requests ask for, in all, against the nodes'."""
    keys = ["cpus", "gpus", "memory_gb"] + sorted({k for r in requests for k, _ in r.custom})
    total = {key: sum(_amount(r, key) for r in requests) for key in keys}
    cap = {key: sum((kind.capacity(key) or 0) * kind.count for kind in kinds) for key in keys}
    return ", ".join(f"{key} {total[key]:g} asked / {cap[key]:g} declared" for key in keys if total[key])


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
