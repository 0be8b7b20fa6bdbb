"""The placement the plan promised, checked against where each Ray actor says it runs.

Pure: :func:`compare` takes the plan and what each actor reported (:meth:`~.ray_node.NodeCollector.topo_node`)
with the totals of the nodes it runs on (``ray.nodes()``), and returns one row per subcollector, planned
beside actual; :func:`verify` raises a :class:`~topo.errors.LaunchError` naming the first subcollector
whose actor does not hold what its plan row asks: each custom resource in the planned amount (the node
it was promised), on a node that has it, and as many GPUs as planned, the ones ``CUDA_VISIBLE_DEVICES``
shows (a runtime_env that overrides it hides Ray's assignment).
"""
from __future__ import annotations

import os
import socket
from typing import Any

from topo.errors import LaunchError


def here() -> dict[str, Any]:
    """In a Ray actor: where it runs, as :func:`compare` reads it (node id, host, pid, the resources Ray assigned
    it, its GPUs and ``CUDA_VISIBLE_DEVICES``)."""
    import ray

    context = ray.get_runtime_context()
    return {"node_id": context.get_node_id(), "hostname": socket.gethostname(), "pid": os.getpid(),
            "assigned": dict(context.get_assigned_resources()), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def compare(plan: dict[str, Any], actors: list[dict], node_totals: dict[str, dict]) -> list[dict[str, Any]]:
    """Per subcollector: ``planned`` (node, resources), ``actual`` (node, host, held resources, GPUs) and
    ``problems`` (empty: as planned)."""
    rows = []
    for index, (sub, actor) in enumerate(zip(plan["placement"]["subcollectors"], actors)):
        planned = sub["resources"]
        held = actor.get("assigned") or {}
        totals = node_totals.get(actor["node_id"], {})
        problems = []
        for name, amount in planned["custom"].items():
            if abs(held.get(name, 0) - amount) > 1e-9:
                problems.append(f"holds {held.get(name, 0):g} of resource {name!r}, planned {amount:g}")
            if name not in totals:
                problems.append(f"its node has no resource {name!r}")
        gpus = actor.get("gpu_ids") or []
        if planned["gpus"] >= 1 and len(gpus) != int(planned["gpus"]):
            problems.append(f"holds {len(gpus)} GPU(s), planned {planned['gpus']:g}")
        visible = actor.get("cuda_visible_devices")
        if gpus and visible is not None and sorted(visible.split(",")) != sorted(gpus):
            problems.append(f"CUDA_VISIBLE_DEVICES={visible} but Ray assigned GPU(s) {','.join(gpus)}")
        rows.append({"subcollector": index,
                     "planned": {"node": sub["node"], "custom": planned["custom"], "gpus": planned["gpus"],
                                 "cpus": planned["cpus"]},
                     "actual": {"node_id": actor["node_id"], "hostname": actor["hostname"], "pid": actor["pid"],
                                "held": held, "gpu_ids": gpus, "cuda_visible_devices": visible,
                                "run_dir": actor["run_dir"],
                                "node_custom": sorted(custom_resources(totals))},
                     "problems": problems})
    return rows


def verify(rows: list[dict[str, Any]]) -> None:
    """Raise for the first subcollector whose actor is not where the plan put it."""
    for row in rows:
        if row["problems"]:
            actual = row["actual"]
            raise LaunchError(f"subcollector {row['subcollector']} is not where the plan put it: its actor on "
                              f"{actual['hostname']} (node {actual['node_id'][:12]}) " + "; ".join(row["problems"]),
                              subcollector=row["subcollector"])


def describe(rows: list[dict[str, Any]]) -> list[str]:
    """The report's lines: each actor's planned node and resources beside its node (a subcollector's, the server's)."""
    out = []
    for row in rows:
        planned, actual = row["planned"], row["actual"]
        asked = ", ".join(f"{k} {v:g}" for k, v in planned["custom"].items()) or "no custom resource"
        where = f" ({planned['node']})" if planned["node"] else ""
        status = "ok" if not row["problems"] else "MISMATCH: " + "; ".join(row["problems"])
        who = "server" if row["subcollector"] is None else f"sub{row['subcollector']}"
        out.append(f"    {who}: planned {asked}{where} -> node {actual['node_id'][:12]} on "
                   f"{actual['hostname']}, pid {actual['pid']}, gpus {actual['gpu_ids'] or 'none'} [{status}]")
    return out


def holds(totals: dict[str, float], wanted: dict[str, float]) -> bool:
    """Whether a node with these resource ``totals`` has every resource ``wanted``, in that amount."""
    return all(totals.get(name, 0) >= amount for name, amount in wanted.items() if amount)


def reason(err: BaseException) -> str:
    """The first line of what Ray (or torchrl through it) raised: what a message quotes."""
    return ((getattr(err, "error_msg", None) or str(err)).strip().splitlines() or [type(err).__name__])[0]


def custom_resources(totals: dict[str, float]) -> dict[str, float]:
    """A node's own resources (``--resources``) among its ``ray.nodes()`` totals: not CPU, GPU, memory or Ray's node tags."""
    return {name: amount for name, amount in totals.items() if not _builtin(name)}


def _builtin(name: str) -> bool:
    return name in ("CPU", "GPU", "memory", "object_store_memory") or name.startswith(("node:", "accelerator_type:"))
