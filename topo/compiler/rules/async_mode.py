"""Rules on ``collector.mode: async``: what one AsyncBatchedCollector over every worker can run, refused at
validate with the reason, never found mid-run.

Async mode keeps the plan rows, seeds, episode records, the trainer's weight updates, evaluation (its eval rows in
a sync collector of their own, as in multi mode), restarts of a dead or hung worker and recycles (its subcollector's
rows) and the report, on this machine or on Ray (one actor per node running the async loop over that node's rows,
:mod:`topo.launch.ray.async_nodes`); it does not run with the policy anywhere but its server, nor (on Ray) with a
shared run directory, an eval section, or a server asking for custom resources: each is refused here.
"""
from __future__ import annotations

from topo.backends.base import INSTRUCTION_BYTES
from topo.diagnostics import Diagnostic, error
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context

MULTI = "or use collector.mode: multi"


def async_mode(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Async mode needs a declared layout, a served policy, the local engine, and none of the features it lacks."""
    if spec.mode != "async":
        return []
    out = []
    mode = ("collector", "mode")
    if ctx.backend is not None and ctx.backend.layout(spec.env_kwargs) is None:
        out.append(error("async-layout-unknown", f"backend {spec.backend!r} declares no observation layout for these "
                         "kwargs: async mode sizes its shared-memory request slots from it, and learning it would "
                         "mean building an env in the trainer", mode,
                         "give the backend a layout() (topo/backends/base.py; libero: leave proprio_keys out), " + MULTI))
    if spec.policy is None:
        out.append(error("async-needs-policy", "async mode serves the policy from one inference server process, "
                         "built from a factory; the spec has no policy section", mode,
                         "add policy: {factory: package.module:function}, " + MULTI))
    elif spec.wrote("policy", "placement") and spec.policy.placement != "server" or spec.wrote("policy", "weight_sync"):
        key = "weight_sync" if spec.wrote("policy", "weight_sync") else "placement"
        out.append(error("async-policy-placement", "async mode serves the policy from one inference server: there is "
                         "no copy per subcollector to place or to send weights to", ("policy", key),
                         f"remove policy.{key}, " + MULTI))
    if spec.placement.engine == "ray":
        out += _on_ray(spec)
    elif spec.placement.engine != "local":
        out.append(error("async-needs-local-engine", f"async mode runs its env workers and server on this machine or, "
                         f"under placement.engine ray, on each node: not under engine {spec.placement.engine!r}",
                         ("placement", "engine"), "use placement.engine: local or ray, " + MULTI))
    if spec.transforms and spec.transforms_at == "subcollector":
        out.append(error("async-transforms-at-subcollector", "env.transforms_at: subcollector wraps a subcollector's "
                         "ParallelEnv, which async mode does not build (one collector over every env worker)",
                         ("env", "transforms_at"), "use transforms_at: worker (each env worker's env), " + MULTI))
    if spec.wrote("collector", "sync") and not spec.sync:
        out.append(error("async-sync-unused", "collector.sync chooses between torchrl's multi collectors; async mode "
                         "has no barrier to drop", ("collector", "sync"), "remove collector.sync, " + MULTI))
    for task, text in sorted({**(ctx.catalog.language if ctx.catalog else {}), **spec.instructions}.items()):
        if text is not None and len(text.encode()) > INSTRUCTION_BYTES:
            where = ("assignment", "instructions", task) if task in spec.instructions else mode
            out.append(error("async-instruction-too-long", f"task {task}'s instruction is {len(text.encode())} bytes: "
                             f"an async request slot holds {INSTRUCTION_BYTES}", where,
                             "shorten it, " + MULTI))
    return out


def _on_ray(spec: Spec) -> list[Diagnostic]:
    """Async mode on Ray: what the node actors (each its async loop and its own server) do not hold yet."""
    out = []
    if spec.placement.run_dir != "per_node":
        out.append(error("async-ray-shared-run-dir", "async mode on Ray keeps each node's records in a run directory "
                         "of that node's own, pulled through Ray; placement.run_dir: shared is not supported with it yet",
                         ("placement", "run_dir"), "remove placement.run_dir (per_node), " + MULTI))
    if spec.placement.server.custom:
        out.append(error("async-ray-server-custom", "async mode on Ray runs a server on each node, inside that node's "
                         "actor (placement.server's cpus and gpus are added to its request): custom resources would pin "
                         "every node's actor where they are", ("placement", "server", "custom"),
                         "remove placement.server.custom, " + MULTI))
    if spec.eval is not None:
        out.append(error("async-ray-eval", "async mode on Ray does not run an eval section yet", ("eval",),
                         "remove the eval section, " + MULTI))
    return out
