"""What the first batch shows of each worker (instruction, group-id blocks), checked against the plan.

:func:`observe_batch` runs in the collector process on a torchrl batch; :func:`check` is pure and
runs in the top process. ``language_instruction`` and ``group_id`` are what ToyVLAEnv and LiberoEnv
emit; a backend without them (gym) leaves nothing to check here.
"""
from __future__ import annotations

from typing import Any

from ..assign import GROUP_ID_OFFSET as GROUP_BLOCK  # a plan group's ids lie in [group, group + 1) x this


def observe_batch(batch: Any, sync: bool) -> list[dict]:
    """Per subcollector batch, per worker: distinct instructions and group-id blocks seen.

    A sync batch stacks subcollectors on dim 0 (``[C, M, T]``); an async batch is one subcollector's
    ``[M, T]``, from a subcollector torchrl does not name (``subcollector: None``).
    """
    parts = [(c, batch[c]) for c in range(batch.shape[0])] if sync else [(None, batch)]
    return [{"subcollector": c, "workers": [_worker(part[w]) for w in range(part.shape[0])]} for c, part in parts]


def _worker(td: Any) -> dict:
    seen: dict[str, list] = {}
    instructions = td.get("language_instruction", None)
    if instructions is not None:
        seen["instructions"] = sorted(set(_flatten(instructions.tolist())))
    group_ids = td.get("group_id", None)
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


def check(plan: dict, batches: list[dict]) -> list[dict]:
    """One entry per subcollector: what was observed and where it differs from the plan.

    Async batches are attributed to the subcollector whose plan rows they match; a batch that
    matches none is reported as ``unmatched``.
    """
    subs = plan["subcollectors"]
    result: list[dict] = [{"subcollector": s["index"], "status": "not observed"} for s in subs]
    unmatched, blind = [], False
    for batch in batches:
        workers = batch["workers"]
        if not any(workers):  # nothing observable (e.g. gym)
            blind = True
            continue
        if batch["subcollector"] is not None:
            candidates = [batch["subcollector"]]
        else:  # the first subcollector it matches that has not been seen yet, else any it matches
            matching = [s["index"] for s in subs if s["num_workers"] == len(workers) and not mismatches(s, workers)]
            candidates = sorted(matching, key=lambda c: result[c]["status"] != "not observed")
        if not candidates:
            unmatched.append(workers)
            continue
        c = candidates[0]
        if result[c]["status"] != "not observed":
            continue  # a later batch of a subcollector already checked
        bad = mismatches(subs[c], workers)
        result[c] = {
            "subcollector": c,
            "status": "mismatch" if bad else "ok",
            "instructions": sorted({i for w in workers for i in w.get("instructions", [])}),
            "groups": sorted({g for w in workers for g in w.get("groups", [])}),
            "mismatches": bad,
        }
    if blind:
        for entry in result:
            if entry["status"] == "not observed":
                entry["status"] = "nothing observable"
    if unmatched:
        result.append({"subcollector": None, "status": "unmatched", "batches": unmatched})
    return result
