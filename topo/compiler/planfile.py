"""A saved plan as input: read within bounds, checked as strictly as a spec, sealed with a digest.

Plans travel between people and machines, and ``topo launch`` runs one as it is, so a plan edited
by hand (a wrong type, a missing row, a huge number) is refused with the field named, never left to
fail inside a launch. In order: format and topo version (:class:`StalePlanError`), the JSON Schema
``topo/compiler/schemas/topo-plan.schema.json``, the rules a schema cannot say (indices consecutive, counts
matching their lists, each row's kwargs matching the row), the depth of the free-form parts, and
the digest that :func:`seal` records: the sha256 of the plan's own content, and of each part, so a
plan changed after it was written is refused, naming what changed, unless the caller allows it.
Imports no torch.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import replace
from typing import Any, Iterator, Mapping

from topo.compiler import schema
from topo.diagnostics import Diagnostic, error, format_path, warning
from topo.errors import SpecError, StalePlanError
from topo.compiler.limits import MAX_PLAN_BYTES, MAX_PLAN_DEPTH, MAX_SPEC_BYTES, count

FORMAT = "topo.plan/1"
SCHEMA_FILE = "topo-plan.schema.json"
MAX_REPORTED = 20  # problems listed one by one; the rest are counted
_HEAD = 4096  # bytes read first: enough for "format": "topo.plan/1", which seal() writes at the top
REWRITE_HINT = "re-run `topo plan -o` from the spec: topo writes plans, people read them"
EDITED_HINT = "re-run `topo plan -o` from the spec; to run the plan as it is, pass --allow-edited-plan " \
              "(allow_edited=True in Python)"


def seal(plan: Mapping[str, Any]) -> dict[str, Any]:
    """``plan`` with its digest, last (any digest it had is replaced)."""
    out = {key: value for key, value in plan.items() if key != "digest"}
    out["digest"] = digest(plan)
    return out


def digest(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The sha256 of each part of ``plan`` (each top-level key, each subcollector) and of them all."""
    parts = {name: hashlib.sha256(_canonical(value)).hexdigest() for name, value in _parts(plan)}
    return {"sha256": hashlib.sha256(_canonical(parts)).hexdigest(), "parts": parts}


def _parts(plan: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, value in plan.items():
        if key == "subcollectors" and isinstance(value, list):
            yield from ((f"subcollectors[{i}]", sub) for i, sub in enumerate(value))
        elif key != "digest":
            yield key, value


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def read(path: str) -> dict | None:
    """The plan saved at ``path``, not yet checked; None when the file is no plan (then it is a spec).

    Bounded: a plan of more than :data:`~topo.compiler.limits.MAX_PLAN_BYTES` is refused before it is read,
    one nested past what Python's JSON reader follows is refused (``plan-too-deep``).
    """
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD)
            if not head.lstrip().startswith(b"{"):
                return None
            fail = functools.partial(_fail, path) if b'"topo.plan/' in head else None
            limit = MAX_PLAN_BYTES if fail else MAX_SPEC_BYTES  # JSON that does not look like a plan may be a spec
            size = os.fstat(handle.fileno()).st_size  # 0 for a pipe: then the bounded read below decides
            data = b"" if size > limit else head + handle.read(limit + 1 - len(head))
    except OSError:
        return None  # the spec loader says why it cannot be read
    if size > limit or len(data) > limit:
        if fail is None:
            return None  # the spec loader refuses it as a spec
        what = count(size) if size > MAX_PLAN_BYTES else f"more than {count(MAX_PLAN_BYTES)}"
        fail("plan-too-large", f"the plan file is {what} bytes (limit {count(MAX_PLAN_BYTES)})",
             "a plan holds one row per worker: this is far more than any topology")
    try:
        plan = json.loads(data, parse_constant=_not_json)
    except RecursionError:
        if fail is None:
            return None
        fail("plan-too-deep", f"the plan nests more than {MAX_PLAN_DEPTH} levels deep, past what Python's JSON "
             f"reader follows (limit {MAX_PLAN_DEPTH})", "a plan nests 8 levels, plus the spec's env kwargs")
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        if fail is None:
            return None
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        fail("plan-syntax", f"not valid JSON{where}: {getattr(exc, 'msg', exc)}", REWRITE_HINT)
    if isinstance(plan, dict) and str(plan.get("format", "")).startswith("topo.plan/"):
        return plan
    return None


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _fail(file: str, code: str, message: str, hint: str | None) -> None:
    raise SpecError([Diagnostic(code, "error", message, (), hint, file)])


def check_compatible(plan: Mapping[str, Any]) -> None:
    """Raise :class:`StalePlanError` unless this topo can run a plan of ``plan``'s format and version."""
    from topo.version import __version__

    if plan.get("format") != FORMAT:
        raise StalePlanError(f"plan format {plan.get('format')!r} is not {FORMAT!r}; re-run `topo plan`")
    if str(plan.get("topo_version")).split(".")[0] != __version__.split(".")[0]:
        raise StalePlanError(
            f"plan written by topo {plan.get('topo_version')}, this is topo {__version__}; re-run `topo plan`")


def check(plan: Any, *, file: str = "<plan>", allow_edited: bool = False,
          require_digest: bool = False) -> list[Diagnostic]:
    """Raise unless ``plan`` can run as it is; returns the warnings (an edit that ``allow_edited`` let through).

    :class:`StalePlanError` for another format or topo version; :class:`SpecError` (exit 2) for
    everything else, each diagnostic naming the field. A plan without a digest passes unless
    ``require_digest`` (a plan file: written by hand, or by a topo before digests).
    """
    if not isinstance(plan, dict):
        _fail(file, "plan-schema-type", f"a plan is a JSON object, not {type(plan).__name__}", None)
    check_compatible(plan)
    found = _schema(plan)
    if not found:
        found = _rules(plan)
    if not found:
        found = _depth(plan)
    if found:
        raise SpecError([replace(d, file=file) for d in found])
    notes = _digest(plan, allow_edited, require_digest)
    if any(d.is_error for d in notes):
        raise SpecError([replace(d, file=file) for d in notes])
    return [replace(d, file=file) for d in notes]


def _schema(plan: dict) -> list[Diagnostic]:
    """The schema's verdict on the plan without its rows, then on each row (jsonschema only where it fails)."""
    skeleton, rows = _without_rows(plan, ())
    evaluated = plan.get("eval")
    eval_rows: list[tuple[tuple, Any]] = []
    if isinstance(evaluated, dict):
        bare, eval_rows = _without_rows(evaluated, ("eval",))
        skeleton = {**skeleton, "eval": bare}
    found = [] if schema.quick(SCHEMA_FILE)(skeleton) else schema.violations(skeleton, SCHEMA_FILE)
    bad = []
    for part, listed in (("row", rows), ("eval_row", eval_rows)):
        quick_row = schema.quick(SCHEMA_FILE, part)
        bad += [(path, row, part) for path, row in listed if not quick_row(row)]
    for path, row, part in bad[:MAX_REPORTED]:
        found += [replace(d, path=path + d.path) for d in schema.violations(row, SCHEMA_FILE, part)]
    if len(bad) > MAX_REPORTED:
        found.append(error("plan-schema-rows", f"... and {count(len(bad) - MAX_REPORTED)} more row(s) like these "
                           f"({count(len(bad))} in all)", bad[MAX_REPORTED][0]))
    return [replace(d, code="plan-" + d.code, hint=REWRITE_HINT) if d.code.startswith("schema-") else d
            for d in found]


def _without_rows(section: dict, at: tuple) -> tuple[dict, list[tuple[tuple, Any]]]:
    """``section`` with its subcollectors' rows taken out (checked one by one), and those rows with their paths."""
    subs = section.get("subcollectors")
    if not isinstance(subs, list):
        return section, []
    bare = {**section, "subcollectors": [{**s, "workers": []} if isinstance(s, dict) and
                                         isinstance(s.get("workers"), list) else s for s in subs]}
    rows = [(at + ("subcollectors", i, "workers", j), row) for i, s in enumerate(subs) if isinstance(s, dict)
            and isinstance(s.get("workers"), list) for j, row in enumerate(s["workers"])]
    return bare, rows


def _rules(plan: dict) -> list[Diagnostic]:
    """What the schema cannot say: indices, counts, and each row's kwargs against the row itself."""
    found: list[Diagnostic] = []

    def bad(message: str, *path) -> None:
        found.append(error("plan-inconsistent", message, path, REWRITE_HINT))

    subs = plan["subcollectors"]
    env = plan["env"]
    if ("transforms" in env) != ("transforms_at" in env):
        bad("env.transforms and env.transforms_at come together", "env")
    if len(plan["placement"]["subcollectors"]) != len(subs):
        bad(f"placement lists {len(plan['placement']['subcollectors'])} subcollector(s), the plan has {len(subs)}",
            "placement", "subcollectors")
    g = 0
    for i, sub in enumerate(subs):
        if sub["index"] != i:
            bad(f"subcollector {i} has index {sub['index']}", "subcollectors", i, "index")
        if sub["num_workers"] != len(sub["workers"]):
            bad(f"num_workers is {sub['num_workers']} but the subcollector lists {len(sub['workers'])} worker(s)",
                "subcollectors", i, "num_workers")
        for j, row in enumerate(sub["workers"]):
            where = ("subcollectors", i, "workers", j)
            expected = {"subcollector": i, "index": j, "global_index": g}
            for key, value in expected.items():
                if row[key] != value:
                    bad(f"{key} is {row[key]}, expected {value} (rows are in order: subcollector, index, global "
                        "index from 0)", *where, key)
            kwargs = row["kwargs"]
            for key, value in (("worker", expected), ("seed", row["seed"]), ("render_gpu", row["render_gpu"]),
                               ("backend", env["backend"]), ("builder", env["builder"]),
                               ("transforms", row_transforms(env))):
                if kwargs.get(key) != value:
                    said = "plan" if key in ("backend", "builder", "transforms") else "row"
                    bad(f"kwargs.{key} is {kwargs.get(key)!r} but the {said} says {value!r}", *where, "kwargs", key)
            if row["group"] != row["group_id_offset"] // 10**6:
                bad(f"group {row['group']} does not match group_id_offset {row['group_id_offset']} "
                    f"(group = group_id_offset // 1000000)", *where, "group")
            g += 1
            if len(found) > MAX_REPORTED:
                return found
    if plan["coverage"]["workers"] != g or plan["coverage"]["subcollectors"] != len(subs):
        bad(f"coverage counts {plan['coverage']['workers']} worker(s) in {plan['coverage']['subcollectors']} "
            f"subcollector(s), the rows {g} in {len(subs)}", "coverage")
    if plan.get("eval") is not None:
        _eval_rules(plan["eval"], env, bad)
    return found


def row_transforms(env: Mapping[str, Any]) -> list | None:
    """The transforms each row's kwargs carry: the plan's, when placed in workers."""
    return env.get("transforms") if env.get("transforms_at") == "worker" else None


def _eval_rules(section: dict, env: dict, bad) -> None:
    """The eval rows: in order, their episodes numbered 0..E-1 across them, each row's kwargs matching the row."""
    g = episode = 0
    per_worker = section["coverage"]["per_worker"]
    for i, sub in enumerate(section["subcollectors"]):
        if sub["index"] != i:
            bad(f"eval subcollector {i} has index {sub['index']}", "eval", "subcollectors", i, "index")
        if sub["num_workers"] != len(sub["workers"]):
            bad(f"num_workers is {sub['num_workers']} but the eval subcollector lists {len(sub['workers'])} "
                "worker(s)", "eval", "subcollectors", i, "num_workers")
        for j, row in enumerate(sub["workers"]):
            where = ("eval", "subcollectors", i, "workers", j)
            expected = {"subcollector": i, "index": j, "global_index": g}
            for key, value in expected.items():
                if row[key] != value:
                    bad(f"{key} is {row[key]}, expected {value} (eval rows are in order: subcollector, index, "
                        "global index from 0)", *where, key)
            numbers = [ep["episode"] for ep in row["episodes"]]
            if numbers != list(range(episode, episode + len(numbers))):
                bad(f"episodes {numbers[0]}..{numbers[-1]} of this row do not follow the previous row's (the next "
                    f"is {episode}): episodes are numbered 0..E-1 across the eval rows", *where, "episodes")
            episode += len(numbers)
            tasks = list(dict.fromkeys(ep["task_id"] for ep in row["episodes"]))
            if row["tasks"] != tasks:
                bad(f"tasks {row['tasks']} are not its episodes' ({tasks})", *where, "tasks")
            kwargs, schedule = row["kwargs"], row["kwargs"]["schedule"]
            envs = schedule["envs"]
            first = json.dumps(row["episodes"][0]["task_id"])
            for key, value, said in (("worker", {**expected, "role": "eval"}, "row"),
                                     ("seed", row["episodes"][0]["seed"], "row's first episode"),
                                     ("render_gpu", row["render_gpu"], "row"),
                                     ("backend", env["backend"], "plan"), ("builder", env["builder"], "plan"),
                                     ("env", envs.get(first), f"schedule's env of task {first}"),
                                     ("transforms", row_transforms(env), "plan")):
                if kwargs.get(key) != value:
                    bad(f"kwargs.{key} is {kwargs.get(key)!r} but the {said} says {value!r}", *where, "kwargs", key)
            if schedule["episodes"] != row["episodes"]:
                bad("kwargs.schedule.episodes are not the row's episodes", *where, "kwargs", "schedule", "episodes")
            if set(envs) != {json.dumps(t) for t in tasks}:
                bad(f"kwargs.schedule.envs has {sorted(envs)}, the row's tasks are {tasks}", *where, "kwargs",
                    "schedule", "envs")
            if g < len(per_worker) and (per_worker[g]["episodes"], per_worker[g]["tasks"]) != (len(numbers), tasks):
                bad(f"coverage.per_worker[{g}] does not count eval row {g}", "eval", "coverage", "per_worker", g)
            g += 1
    cov = section["coverage"]
    if (section["episodes"], cov["episodes"], cov["workers"], len(per_worker)) != (episode, episode, g, g):
        bad(f"eval counts {section['episodes']} episode(s) (coverage: {cov['episodes']} over {cov['workers']} "
            f"worker(s)), the rows {episode} over {g}", "eval", "episodes")


def _depth(plan: dict) -> list[Diagnostic]:
    """The free-form parts (env kwargs, transforms, runtime_env) nest at most as deep as a spec may: a part ``n`` levels down
    nests at most ``MAX_PLAN_DEPTH - n`` levels."""
    parts = [(("env", "kwargs"), plan["env"]["kwargs"]), (("placement", "runtime_env"), plan["placement"]["runtime_env"])]
    parts += [(("env", "transforms"), plan["env"].get("transforms", []))]  # each row's copy is the same (_rules)
    parts += [(("subcollectors", i, "workers", j, "kwargs", "env"), row["kwargs"]["env"])
              for i, sub in enumerate(plan["subcollectors"]) for j, row in enumerate(sub["workers"])]
    for i, sub in enumerate((plan.get("eval") or {}).get("subcollectors", ())):
        for j, row in enumerate(sub["workers"]):
            where = ("eval", "subcollectors", i, "workers", j, "kwargs")
            parts += [(where + ("env",), row["kwargs"]["env"])]
            parts += [(where + ("schedule", "envs", key), env) for key, env in row["kwargs"]["schedule"]["envs"].items()]
    for path, value in parts:
        depth, limit = _nesting(value), MAX_PLAN_DEPTH - max(len(path) + 1, 7)  # a row's kwargs.env: 7 levels down
        if depth > limit:
            return [error("plan-too-deep", f"{format_path(path)} nests {depth} levels deep (limit {limit}, "
                          f"{MAX_PLAN_DEPTH} for the whole plan)", path, "a spec's env kwargs nest a few levels")]
    return []


def _nesting(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _digest(plan: dict, allow_edited: bool, require_digest: bool) -> list[Diagnostic]:
    recorded = plan.get("digest")
    report = warning if allow_edited else error
    if recorded is None:
        if not require_digest:
            return []
        return [report("plan-no-digest", "the plan has no digest: written by hand, or by a topo before 0.1 "
                       "recorded one, so whether it was changed cannot be told", ("digest",), EDITED_HINT)]
    try:
        now = digest(plan)
    except ValueError as exc:  # NaN or infinity in an in-memory plan
        return [error("plan-not-json", f"the plan holds a value JSON cannot: {exc}", (), None)]
    if now["sha256"] == recorded["sha256"]:
        return []
    before = recorded["parts"]
    changed = [name for name in now["parts"] if before.get(name) != now["parts"][name]]
    changed += [f"{name} (removed)" for name in before if name not in now["parts"]]
    shown = ", ".join(changed[:MAX_REPORTED]) + (f" and {len(changed) - MAX_REPORTED} more" if len(changed) >
                                                 MAX_REPORTED else "")
    return [report("plan-edited", f"the plan was changed after topo wrote it: {shown or 'its digest'} "
                   "no longer match(es) the digest", ("digest",), EDITED_HINT)]
