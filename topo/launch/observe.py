"""What each subcollector's batches show (instructions, group-id blocks, policy versions), checked
against the plan.

:func:`hook` is the ``post_collect_hook`` topo gives the collector: it runs inside each subcollector on
each of its batches and replaces that subcollector's ``observed/`` record (so attribution is exact, in
sync and async mode alike). :func:`check` is pure and runs in the trainer. The batch keys that show a
worker's instruction and group are its backend's (:attr:`topo.backends.Backend.batch_keys`), and
``policy_version`` is what topo's policies emit; a backend without such keys (gym) leaves nothing to check.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Callable

from topo.runtime import heartbeat
from topo.launch import episode_versions
from topo.compiler.assign import GROUP_ID_OFFSET as GROUP_BLOCK  # a plan group's ids lie in [group, group + 1) x this
from topo.runtime.rundir import RunDir, restart_number

_here: dict[str, Any] = {}  # in a subcollector process: its index and its batch count


def set_subcollector(index: int, backend: str | None) -> None:
    """Called by the subcollector's env factory: the index :func:`hook` reports under, and its backend's batch keys."""
    _here.update(index=index, keys=_keys(backend), batches=0, first=None, first_time=None)


def instruction_key(backend: str | None) -> str | None:
    """The batch key that holds the instruction (a string per step) for ``backend`` (None: none)."""
    return _keys(backend).instruction


def _keys(backend: str | None):
    from topo.backends import BatchKeys, get_backend

    try:
        return get_backend(backend).batch_keys if backend else BatchKeys()
    except LookupError:
        return BatchKeys()


def hook(batch: Any, user_hook: Callable | None = None) -> None:
    """Record this subcollector's batch (``[M, T]``: M workers); then call the user's hook, if any.

    A restarted subcollector keeps a record of its own (``sub{c}.r{k}``): its first batch is checked too.
    """
    heartbeat.delivered()
    run = RunDir.current()
    if run is not None and "index" in _here:
        _here["batches"] += 1
        if _here["first"] is None:
            _here.update(first=[worker_seen(batch[w], _here["keys"]) for w in range(batch.shape[0])], first_time=time.time())
        versions = batch.get("policy_version", None)
        k = restart_number()
        episode_versions.record(run.path, _here["index"], k, _here["batches"], batch)
        run.put("observed", f"sub{_here['index']}" + (f".r{k}" if k else ""), subcollector=_here["index"],
                batches=_here["batches"], first=_here["first"], first_time=_here["first_time"],
                policy_versions=None if versions is None else sorted({int(v) for v in versions.flatten().tolist()}))
    if user_hook is not None:
        user_hook(batch)


def pre_hook(user_hook: Callable | None = None) -> None:
    """Before each rollout of a subcollector: stamp it (a batch is owed from now on); then the user's hook."""
    heartbeat.collecting()
    if user_hook is not None:
        user_hook()


def hooks_with(pre: Callable | None, post: Callable | None) -> dict[str, Callable]:
    """topo's ``pre_collect_hook`` and ``post_collect_hook``, each calling the user's after its own."""
    return {"pre_collect_hook": functools.partial(pre_hook, user_hook=pre) if pre is not None else pre_hook,
            "post_collect_hook": functools.partial(hook, user_hook=post) if post is not None else hook}


def worker_seen(td: Any, keys: Any) -> dict:
    """What one worker's steps show: its instructions and group blocks (the fields its plan row fixes)."""
    seen: dict[str, list] = {}
    instructions = td.get(keys.instruction, None) if keys.instruction else None
    if instructions is not None:
        seen["instructions"] = sorted(set(_flatten(instructions.tolist())))
    group_ids = td.get(keys.group, None) if keys.group else None
    if group_ids is not None:
        seen["groups"] = sorted({int(g) // GROUP_BLOCK for g in group_ids.flatten().tolist()})
    return seen


def _flatten(value: Any) -> list:
    if isinstance(value, list):
        return [x for item in value for x in _flatten(item)]
    return [value]


def mismatches(sub: dict, observed: list[dict]) -> list[dict]:
    """Per worker, each observed field that differs from the plan row."""
    out = []
    for row, seen in zip(sub["workers"], observed):
        planned = {"instructions": [row["instruction"]], "groups": [row["group"]]}
        for field, values in seen.items():
            if field == "instructions" and row["instruction"] is None:
                continue  # the env chose its own instruction
            if values != planned[field]:
                out.append({"worker": row["index"], "field": field, "planned": planned[field], "observed": values})
    return out


def check(plan: dict, observed: dict[int, dict | None]) -> list[dict]:
    """One entry per subcollector: its first batch against its plan rows, and its latest policy versions."""
    result = []
    for sub in plan["subcollectors"]:
        record = observed.get(sub["index"])
        if record is None:
            result.append({"subcollector": sub["index"], "status": "not observed"})
            continue
        workers = record["first"]
        tasks = (t for w in sub["workers"] for t in w.get("tasks") or [w.get("task_id")])  # eval rows: several
        entry = {"subcollector": sub["index"], "tasks": list(dict.fromkeys(tasks)),
                 "batches": record["batches"], "policy_versions": record.get("policy_versions")}
        if not any(workers):
            entry["status"] = "nothing observable"
        else:
            bad = mismatches(sub, workers)
            entry.update(status="mismatch" if bad else "ok",
                         instructions=sorted({i for w in workers for i in w.get("instructions", [])}),
                         groups=sorted({g for w in workers for g in w.get("groups", [])}), mismatches=bad)
        result.append(entry)
    return result
