"""Checks on the data before it is typed: the driver runs them beside the schema, not as rules of a Spec."""
from __future__ import annotations

import datetime
import math
from typing import Any

from topo.diagnostics import Diagnostic, error
from topo.compiler.limits import MAX_EVAL_EPISODES, MAX_SUBCOLLECTOR_IDS, MAX_TASK_IDS
from topo.compiler.rules.context import load_backend
from topo.compiler.spec import split_item


def too_many_ids(data: dict) -> list[Diagnostic]:
    """Task, init state and subcollector ranges naming more ids than any topology can use, refused before they
    expand."""
    assign, placed, evaluate = data.get("assignment"), data.get("placement"), data.get("eval")
    tasks = assign.get("tasks") if isinstance(assign, dict) else None
    overrides = placed.get("overrides") if isinstance(placed, dict) else None
    named = [(("assignment", "tasks"), tasks)] if isinstance(tasks, (str, list)) else []
    out = _ids_within(named, MAX_TASK_IDS, "task", "workers cycle through the tasks: name at most as many as there "
                      "are workers")
    named = [(("placement", "overrides", i, "subcollectors"), o.get("subcollectors"))
             for i, o in enumerate(overrides if isinstance(overrides, list) else []) if isinstance(o, dict)]
    out += _ids_within(named, MAX_SUBCOLLECTOR_IDS, "subcollector", "a topology has at most 4,096 subcollectors")
    if isinstance(evaluate, dict):
        for key, what in (("tasks", "eval task"), ("init_states", "eval init state")):
            items = evaluate.get(key)
            if isinstance(items, (str, list)):
                out += _ids_within([(("eval", key), items)], MAX_EVAL_EPISODES, what, "each runs at least one "
                                   f"episode, and an evaluation runs at most {MAX_EVAL_EPISODES:,}")
    return out


def _ids_within(named: list[tuple[tuple, Any]], limit: int, what: str, hint: str) -> list[Diagnostic]:
    spans = []
    for path, items in named:
        for i, item in enumerate(items if isinstance(items, list) else [items]):
            where = path + (i,) if isinstance(items, list) else path
            if isinstance(item, int) and not isinstance(item, bool):
                spans.append((1, where, item))
            elif isinstance(item, str) and (split := split_item(item)) is not None:
                rest = split[1]  # a qualified item's range ('libero_90:0-89') counts as its own
                if rest.count("-") == 1 and all(p.strip().isdigit() for p in rest.split("-")):
                    lo, hi = (int(part) for part in rest.split("-"))
                    spans.append((max(0, hi - lo + 1), where, item))
    total = sum(span for span, _, _ in spans)
    if total <= limit:
        return []
    span, where, item = max(spans, key=lambda s: s[0])
    return [error("range-too-large", f"{what} ranges name {total:,} ids in all (limit {limit:,}); {item!r} alone names "
                  f"{span:,}", where, hint)]


def backend_alone(data: dict) -> list[Diagnostic]:
    """The backend's own checks, when the rest of the spec is too broken for the topology rules."""
    env = data.get("env")
    if not isinstance(env, dict) or not isinstance(env.get("backend"), str):
        return []
    kwargs = env.get("kwargs") if isinstance(env.get("kwargs"), dict) else {}
    backend, out = load_backend(env["backend"])
    if backend is not None:
        out += backend.check_kwargs(kwargs, ("env", "kwargs"))
        if isinstance(env.get("options"), dict):
            out += backend.check_options(env["options"], ("env", "options"))
    return out


def not_json(value: Any, path: tuple) -> list[Diagnostic]:
    """Values a JSON plan cannot hold as they are: YAML dates, binary, sets, NaN, non-string keys."""
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if not isinstance(key, str) and path != ("assignment", "instructions"):
                out.append(error("value-not-json", f"key {key!r} is {_kind(key)}: a plan is JSON, whose keys are "
                                 "strings", path + (key,), f"quote it: '{key}'"))
            out += not_json(item, path + (key,))
        return out
    if isinstance(value, list):
        return [d for i, item in enumerate(value) for d in not_json(item, path + (i,))]
    if value is None or isinstance(value, (str, bool, int)):
        return []
    if isinstance(value, float) and math.isfinite(value):
        return []
    return [error("value-not-json", f"{value} is {_kind(value)}, which a JSON plan cannot hold", path,
                  "quote it to make it a string")]


def _kind(value: Any) -> str:
    return {int: "an integer", float: "a non-finite number", bytes: "binary data", datetime.date: "a date",
            datetime.datetime: "a timestamp"}.get(type(value), f"a {type(value).__name__}")
