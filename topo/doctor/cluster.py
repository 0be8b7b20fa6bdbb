"""``topo doctor`` for ``placement.engine: ray``: :func:`topo.doctor.host.host_checks` on every alive node of the plan's
cluster, each in a Ray task pinned to its node, and each node's memory estimated for the subcollectors it holds.

A node holds a subcollector when its resources include every custom resource the subcollector asks for, in that
amount; one that asks for none may land on any node and is counted against each. :func:`cluster_checks` talks to
Ray (imported there only); the rest is pure: :func:`held`, :func:`check_auth`, :func:`check_placement`,
:func:`check_node_memory`, :func:`render_text`.
"""
from __future__ import annotations

import json
import logging
import socket
from dataclasses import asdict, dataclass
from typing import Any

import click

from topo.checks import FAIL, OK, WARN, Check
from topo.estimate.host import available_gb
from topo.doctor.host import _backend, check_lines, estimate_memory, host_checks, summary, worker_gb
from topo.launch.ray import (AUTH_RUNBOOK, cannot_connect, check_reachable, custom_resources, holds, reason,
                             runtime_env, token_required)

#: the doctor's tasks see the node's GPUs: Ray hides them from a task that asks for none (CUDA_VISIBLE_DEVICES="")
NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"


@dataclass
class NodeReport:
    """One alive node: its custom ``resources``, the ``subcollectors`` the plan puts there, its checks."""

    node_id: str
    hostname: str
    resources: dict[str, float]
    subcollectors: list[int]
    checks: list[Check]


def doctor_cluster(spec: str, plan: dict, fmt: str, timeout: float) -> int:
    """``topo doctor`` on the plan's cluster: print the report, return the exit code (1: a check failed)."""
    nodes, checks = cluster_checks(plan, timeout)
    failed = any(c.status == FAIL for c in checks + [c for n in nodes for c in n.checks])
    if fmt == "json":
        click.echo(json.dumps({"spec": spec, "ok": not failed, "nodes": [asdict(n) for n in nodes],
                               "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        click.echo(render_text(spec, plan, nodes, checks), nl=False)
    return 1 if failed else 0


def cluster_checks(plan: dict, timeout: float) -> tuple[list[NodeReport], list[Check]]:
    """Connect to the plan's cluster, run the host checks on every alive node within ``timeout`` seconds (a node
    that does not answer in time: a FAIL naming it); also who may join it and the placement checks. A cluster not
    reached: LaunchError."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    placement = plan["placement"]
    check_reachable(placement)
    env = runtime_env(plan)
    env["env_vars"] = {**env["env_vars"], NOSET_CUDA: "1"}
    try:
        ray.init(address=placement["address"], runtime_env=env, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as err:
        raise cannot_connect(placement["address"], err) from None
    try:
        asked = placement["address"] if placement["address"] != "auto" else ray.get_runtime_context().gcs_address
        auth = check_auth(placement["address"], token_required(asked))
        alive = [n for n in ray.nodes() if n["Alive"]]
        task = ray.remote(_on_node)
        nodes, refs = [], []
        for n in alive:
            resources = custom_resources(n["Resources"])
            nodes.append(NodeReport(n["NodeID"], n.get("NodeManagerHostname", "?"), resources, held(plan, resources), []))
            refs.append(task.options(num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote(plan, nodes[-1].subcollectors))
        _, late = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        for ref in late:
            ray.cancel(ref, force=True)
        for node, ref in zip(nodes, refs):
            _fill(node, plan, None if ref in late else ref, timeout)
        nodes.sort(key=lambda n: (not n.subcollectors, n.subcollectors, n.node_id))  # in subcollector order
        return nodes, [auth, *check_placement(plan, {n.node_id: (n.hostname, n.resources) for n in nodes})]
    finally:
        ray.shutdown()


def _fill(node: NodeReport, plan: dict, ref: Any, timeout: float) -> None:
    """``node``'s checks from its task's answer ``ref`` (None: it did not answer in ``timeout`` seconds)."""
    import ray

    where = f"node {node.node_id[:12]} on {node.hostname}"
    if ref is None:
        node.checks = [Check("node", FAIL, f"{where} did not answer in {timeout:g} s",
                             f"`ray status --address={plan['placement']['address']}`; a node setting up its "
                             "runtime_env may need longer: --node-timeout")]
        return
    try:
        found = ray.get(ref)
    except ray.exceptions.RayError as err:
        node.checks = [Check("node", FAIL, f"the checks did not run on {where}: {reason(err).rstrip('.')}",
                             "see the node's Ray logs (/tmp/ray/session_latest/logs)")]
        return
    node.hostname = found["hostname"]
    node.checks = [*(Check(**c) for c in found["checks"]), check_node_memory(plan, node.subcollectors,
                                                                               found["available_gb"])]


def _on_node(plan: dict, subcollectors: list[int]) -> dict[str, Any]:
    """In the Ray task, on its node: the host checks for ``subcollectors``, the host's name and its free memory."""
    return {"hostname": socket.gethostname(), "available_gb": available_gb(),
            "checks": [asdict(c) for c in host_checks(plan, subcollectors)]}


# -- pure ----------------------------------------------------------------------------------------------

def held(plan: dict, resources: dict[str, float]) -> list[int]:
    """The subcollectors a node with these custom ``resources`` may hold: it has every custom resource one asks
    for, in that amount (one that asks for none: any node)."""
    subs = plan["placement"]["subcollectors"]
    return [i for i, sub in enumerate(subs) if holds(resources, sub["resources"]["custom"])]


def check_auth(address: str, required: bool | None) -> Check:
    """Who may join the cluster at ``address``: ``required`` is whether it refused a call without its token (None:
    not known). One that answered such a call lets anyone who reaches its port join a node or run code: WARN."""
    if required:
        return Check("auth", OK, f"the Ray cluster at {address} refuses a client without its token")
    hint = f"start every node with Ray's token authentication (RAY_AUTH_MODE=token and the token): {AUTH_RUNBOOK}"
    if required is None:
        return Check("auth", WARN, f"could not tell whether the Ray cluster at {address} lets in a client without its "
                     "token: a call without one had no clear answer", f"`RAY_AUTH_MODE=disabled ray status "
                     f"--address={address}` must fail with InvalidAuthToken; else {hint}")
    return Check("auth", WARN, f"the Ray cluster at {address} lets in a client without a token: anyone who reaches its "
                 "port can join it as a node or run code on every node", hint)


def check_placement(plan: dict, nodes: dict[str, tuple[str, dict[str, float]]]) -> list[Check]:
    """Per subcollector that asks for custom resources, and for the inference server's actor, the nodes that have
    them (none: FAIL); one line for the subcollectors that ask for none. ``nodes``: node id -> (host name, custom
    resources)."""
    checks, anywhere = [], []
    for i, sub in enumerate(plan["placement"]["subcollectors"]):
        if sub["resources"]["custom"]:
            checks.append(_holders(f"subcollector {i}", sub["resources"]["custom"], nodes, "placement.overrides"))
        else:
            anywhere.append(i)
    if anywhere:
        checks.append(Check("placement", OK, f"{_subs(anywhere)} {_asks(anywhere)} for no custom resource: Ray may "
                            f"place {'it' if len(anywhere) == 1 else 'them'} on any of the {len(nodes)} node(s)"))
    server = plan["placement"].get("server")
    if server and server["resources"]["custom"]:
        checks.append(_holders("the inference server", server["resources"]["custom"], nodes, "placement.server"))
    return checks


def _holders(who: str, custom: dict[str, float], nodes: dict[str, tuple[str, dict[str, float]]], key: str) -> Check:
    """Which nodes have every custom resource ``who`` asks for, in that amount (none: FAIL)."""
    asked = f"{who} asks for {_amounts(custom)}"
    where = [f"{node_id[:12]} ({host})" for node_id, (host, resources) in nodes.items() if holds(resources, custom)]
    if not where:
        return Check("placement", FAIL, f"{asked}: no node of the cluster has it",
                     f"start a node that has it (`ray start --address=HEAD:6379 --resources='{json.dumps(custom)}'`), "
                     f"or ask for another resource ({key})")
    have = f"node {where[0]} has it" if len(where) == 1 else f"nodes {', '.join(where)} have it"
    return Check("placement", OK, f"{asked}: {have}")


def check_node_memory(plan: dict, subcollectors: list[int], available_gb: float) -> Check:
    """The memory of the subcollectors a node may hold (their workers and collector processes) against what the
    node has available now; those that ask for no custom resource are counted here as on every node."""
    if not subcollectors:
        return Check("memory", OK, f"the plan places no subcollector here, {available_gb:.1f} GB available")
    subs = plan["placement"]["subcollectors"]
    anywhere = [i for i in subcollectors if not subs[i]["resources"]["custom"]]
    note = f"; for {_subs(subcollectors)}"
    if anywhere:
        note += f" ({_subs(anywhere)} {_asks(anywhere)} for no custom resource: counted against every node)"
    workers = sum(plan["subcollectors"][i]["num_workers"] for i in subcollectors)
    return estimate_memory(workers, len(subcollectors), worker_gb(_backend(plan)), available_gb, note)


def render_text(spec: str, plan: dict, nodes: list[NodeReport], checks: list[Check]) -> str:
    """The cluster's checks, then each node's under a line naming it, then the summary over all of them."""
    every = checks + [c for n in nodes for c in n.checks]
    width = max(len(c.name) for c in every)
    workers = "+".join(str(sub["num_workers"]) for sub in plan["subcollectors"])
    lines = [f"topo doctor {spec}: backend {plan['env']['backend']}, workers {workers}, Ray cluster at "
             f"{plan['placement']['address']}, {len(nodes)} alive node(s)", "cluster:", *check_lines(checks, width)]
    for n in nodes:
        subs = _subs(n.subcollectors) if n.subcollectors else "no subcollector"
        lines += [f"node {n.node_id[:12]} on {n.hostname} ({_amounts(n.resources) or 'no custom resource'}): {subs}",
                  *check_lines(n.checks, width)]
    lines.append(summary(every, f"ready to launch on the cluster ({len(nodes)} node(s))", "cannot launch on the cluster"))
    return "\n".join(lines) + "\n"


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{name} {amount:g}" for name, amount in sorted(resources.items()))


def _subs(indices: list[int]) -> str:
    return f"subcollector{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"


def _asks(indices: list[int]) -> str:
    return "asks" if len(indices) == 1 else "ask"
