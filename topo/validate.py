"""Validation: the JSON Schema, then the topology rules. Every problem at once, each located."""
from __future__ import annotations

import copy
import datetime
import difflib
import importlib.util
import math
import multiprocessing
from collections import Counter
from dataclasses import dataclass
from typing import Any

from . import placement, schema
from .assign import task_list
from .backends import Assignment, Backend, TaskCatalog, builtin_names, get_backend
from .diagnostics import Diagnostic, error, ids_text, sort_key, warning
from .limits import MAX_SUBCOLLECTOR_IDS, MAX_TASK_IDS
from .load import Source
from .spec import Spec, from_data, parse_task_item

MAX_TOTAL_WORKERS = 1_000_000
SEED_LIMIT = 2**63


@dataclass
class Checked:
    """What validation produced: diagnostics, and the typed spec when the rules could run."""

    diagnostics: list[Diagnostic]
    spec: Spec | None = None
    backend: Backend | None = None
    catalog: TaskCatalog | None = None

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if not d.is_error]


def validate(source: Source) -> Checked:
    """Check ``source`` against the schema and every topology rule."""
    found = schema.check(source.data)
    spec = None
    backend = catalog = None
    if isinstance(source.data, dict):
        repaired = _without(_respelt(source.data, found), [d.path for d in found if not d.suggestion])
        too_wide = _too_many_ids(repaired)
        found += too_wide
        if not too_wide and not schema.check(repaired):
            spec = from_data(repaired)
            backend, catalog, rule_diags = _rules(spec)
            found += rule_diags
        else:
            found += _backend_alone(repaired)
        reported = {d.path for d in found}
        found += [d for d in _not_json(source.data, ()) if d.path not in reported]
    elif not found:
        found.append(error("schema-type", "the spec must be a mapping of sections", ()))
    aliases = {d.path[:-1] + (d.suggestion,): d.path for d in found if d.suggestion}
    placed = sorted((source.place(d, aliases) for d in found), key=sort_key)
    return Checked(placed, spec, backend, catalog)


def _without(data: dict, paths: list[tuple]) -> dict:
    """A copy of ``data`` without the values that failed the schema, so the rules can still run."""
    out = copy.deepcopy(data)
    for path in paths:
        node: Any = out
        for part in path[:-1]:
            try:
                node = node[part] if not isinstance(node, dict) else node.get(part, node.get(_as_int(part)))
            except (IndexError, TypeError, KeyError):
                node = None
            if node is None:
                break
        if not path or node is None:
            continue
        key = path[-1]
        if isinstance(node, dict):
            node.pop(key, None)
            node.pop(_as_int(key), None)
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node[key] = None
    return out


def _too_many_ids(data: dict) -> list[Diagnostic]:
    """Task and subcollector ranges naming more ids than any topology can use, refused before they expand."""
    assign, placed = data.get("assignment"), data.get("placement")
    tasks = assign.get("tasks") if isinstance(assign, dict) else None
    overrides = placed.get("overrides") if isinstance(placed, dict) else None
    named = [(("assignment", "tasks"), tasks)] if isinstance(tasks, (str, list)) else []
    out = _ids_within(named, MAX_TASK_IDS, "task", "workers cycle through the tasks: name at most as many as there "
                      "are workers")
    named = [(("placement", "overrides", i, "subcollectors"), o.get("subcollectors"))
             for i, o in enumerate(overrides if isinstance(overrides, list) else []) if isinstance(o, dict)]
    return out + _ids_within(named, MAX_SUBCOLLECTOR_IDS, "subcollector", "a topology has at most 4,096 subcollectors")


def _ids_within(named: list[tuple[tuple, Any]], limit: int, what: str, hint: str) -> list[Diagnostic]:
    spans = []
    for path, items in named:
        for i, item in enumerate(items if isinstance(items, list) else [items]):
            where = path + (i,) if isinstance(items, list) else path
            if isinstance(item, int) and not isinstance(item, bool):
                spans.append((1, where, item))
            elif isinstance(item, str) and item.count("-") == 1 and all(p.strip().isdigit() for p in item.split("-")):
                lo, hi = (int(part) for part in item.split("-"))
                spans.append((max(0, hi - lo + 1), where, item))
    total = sum(span for span, _, _ in spans)
    if total <= limit:
        return []
    span, where, item = max(spans, key=lambda s: s[0])
    return [error("range-too-large", f"{what} ranges name {total:,} ids in all (limit {limit:,}); {item!r} alone names "
                  f"{span:,}", where, hint)]


def _respelt(data: dict, found: list[Diagnostic]) -> dict:
    """A copy of ``data`` with each misspelt key renamed to what it most likely meant."""
    out = copy.deepcopy(data)
    for d in found:
        if not d.suggestion:
            continue
        node: Any = out
        for part in d.path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and d.suggestion not in node and d.path[-1] in node:
            node[d.suggestion] = node.pop(d.path[-1])
    return out


def _backend_alone(data: dict) -> list[Diagnostic]:
    """The backend's own checks, when the rest of the spec is too broken for the topology rules."""
    env = data.get("env")
    if not isinstance(env, dict) or not isinstance(env.get("backend"), str):
        return []
    kwargs = env.get("kwargs") if isinstance(env.get("kwargs"), dict) else {}
    out: list[Diagnostic] = []
    backend = _backend(env["backend"], out)
    if backend is not None:
        out += backend.check(kwargs, ("env", "kwargs"))
        if isinstance(env.get("options"), dict):
            out += backend.check_options(env["options"], ("env", "options"))
    return out


def _not_json(value: Any, path: tuple) -> list[Diagnostic]:
    """Values a JSON plan cannot hold as they are: YAML dates, binary, sets, NaN, non-string keys."""
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            if not isinstance(key, str) and path != ("assignment", "instructions"):
                out.append(error("value-not-json", f"key {key!r} is {_kind(key)}: a plan is JSON, whose keys are "
                                 "strings", path + (key,), f"quote it: '{key}'"))
            out += _not_json(item, path + (key,))
        return out
    if isinstance(value, list):
        return [d for i, item in enumerate(value) for d in _not_json(item, path + (i,))]
    if value is None or isinstance(value, (str, bool, int)):
        return []
    if isinstance(value, float) and math.isfinite(value):
        return []
    return [error("value-not-json", f"{value} is {_kind(value)}, which a JSON plan cannot hold", path,
                  "quote it to make it a string")]


def _kind(value: Any) -> str:
    return {int: "an integer", float: "a non-finite number", bytes: "binary data", datetime.date: "a date",
            datetime.datetime: "a timestamp"}.get(type(value), f"a {type(value).__name__}")


def _as_int(key: Any) -> Any:
    return int(key) if isinstance(key, str) and key.isdigit() else key


def _rules(spec: Spec) -> tuple[Backend | None, TaskCatalog | None, list[Diagnostic]]:
    out: list[Diagnostic] = []
    backend = _backend(spec.backend, out)
    catalog = None
    if backend is not None:
        out += backend.check(spec.env_kwargs, ("env", "kwargs"))
        out += backend.check_options(spec.env_options, ("env", "options"))
        for i, block in enumerate(spec.blocks or ()):
            # a block's kwargs go through the same checks; keep what is about its own keys
            where = ("assignment", "blocks", i, "kwargs")
            out += [d for d in backend.check({**spec.env_kwargs, **block.kwargs}, where)
                    if d.path[:len(where)] == where and len(d.path) > len(where) and d.path[len(where)] in block.kwargs]
        if not any(d.is_error for d in out):
            catalog = backend.catalog(spec.env_kwargs)
    out += _topology(spec)
    out += _groups(spec)
    out += _tasks(spec, catalog, backend)
    out += _init_states(spec, catalog)
    out += _seeds(spec)
    out += _start_methods(spec, backend)
    out += _schema_kwargs(spec, backend)
    out += _launch(spec, backend)
    out += _policy(spec)
    out += _render_devices(spec, backend)
    out += placement.check(spec, backend.memory_per_worker_gb if backend is not None else None)
    return backend, catalog, out


def _backend(name: str, out: list[Diagnostic]) -> Backend | None:
    try:
        return get_backend(name)
    except KeyError:
        close = difflib.get_close_matches(name, builtin_names(), n=1)
        hint = f"did you mean {close[0]!r}?" if close else (
            f"use one of {', '.join(builtin_names())}, or a factory 'package.module:callable'")
        out.append(error("backend-unknown", f"unknown backend {name!r}", ("env", "backend"), hint))
    except ImportError as exc:
        out.append(error("backend-unavailable", f"backend {name!r} cannot be loaded: {exc}", ("env", "backend"),
                         "install its extra, e.g. pip install -e '.[libero]'"))
    return None


def _policy(spec: Spec) -> list[Diagnostic]:
    """The policy factory can be imported here; its options fit its placement."""
    p = spec.policy
    if p is None:
        return []
    out = []
    module = p.factory.partition(":")[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        out.append(error("policy-factory-not-found", f"module {module!r} of policy factory {p.factory!r} is not importable",
                         ("policy", "factory"), "put its folder on PYTHONPATH, or install its package"))
    if p.placement == "server" and spec.wrote("policy", "weight_sync"):
        out.append(error("policy-weight-sync-with-server", "weight_sync chooses how subcollector copies receive weights; "
                         "with placement: server, weights go to the server", ("policy", "weight_sync"),
                         "remove weight_sync, or use placement: subcollector"))
    engine = spec.placement.engine
    if p.placement == "server" and engine != "local":
        out.append(error("policy-server-not-local", f"placement: server runs one inference server on this machine; "
                         f"placement.engine {engine!r} spreads subcollectors over nodes", ("policy", "placement"),
                         "use placement: subcollector (each actor builds its copy)"))
    return out


def _topology(spec: Spec) -> list[Diagnostic]:
    out = []
    if spec.workers_listed and len(spec.workers) != spec.subcollectors:
        out.append(error(
            "workers-list-length",
            f"workers_per_subcollector lists {len(spec.workers)} subcollector(s) but subcollectors is {spec.subcollectors}",
            ("topology", "workers_per_subcollector"),
            f"give {spec.subcollectors} numbers, or one number for all",
        ))
    if spec.total_workers > MAX_TOTAL_WORKERS:
        out.append(error(
            "topology-too-large",
            f"{spec.subcollectors} subcollectors x {max(spec.workers)} workers = {spec.total_workers} workers, "
            f"more than {MAX_TOTAL_WORKERS}",
            ("topology",), "split the job across several specs or nodes",
        ))
    return out


def _per_sub_path(spec: Spec, c: int) -> tuple:
    return ("topology", "workers_per_subcollector", c) if spec.workers_listed else ("topology", "workers_per_subcollector")


def _groups(spec: Spec) -> list[Diagnostic]:
    g = spec.groups
    if not g.declared:
        return []
    out = []
    base = ("assignment", "groups")
    if g.candidate_size % g.size:
        up = (g.candidate_size // g.size + 1) * g.size
        out.append(error(
            "candidate-size-multiple",
            f"candidate_size {g.candidate_size} is not a multiple of group size {g.size} "
            f"({g.candidate_size} % {g.size} = {g.candidate_size % g.size})",
            base + ("candidate_size",), f"use candidate_size {up} or a group size that divides {g.candidate_size}",
        ))
    if not g.parallel_repeats:
        return out
    seen = set()
    for c, m in enumerate(spec.workers):
        if m % g.size and (m, _per_sub_path(spec, c)) not in seen:
            seen.add((m, _per_sub_path(spec, c)))
            lo, hi = (m // g.size) * g.size, (m // g.size + 1) * g.size
            divisors = [d for d in range(1, m + 1) if m % d == 0]
            who = f"subcollector {c} has {m} workers" if len(set(spec.workers)) > 1 else f"{m} workers per subcollector"
            out.append(error(
                "group-size-divides-workers",
                f"{who}, not a multiple of group size {g.size} ({m} % {g.size} = {m % g.size}); "
                f"with parallel_repeats each group needs {g.size} workers of one subcollector",
                _per_sub_path(spec, c),
                f"use {f'{lo} or ' if lo else ''}{hi} workers, or a group size that divides {m} "
                f"({', '.join(map(str, divisors[:12]))})",
            ))
    if spec.init_state_mode == "random":
        out.append(error(
            "random-init-with-parallel-groups",
            "init_states.mode 'random' with parallel_repeats: workers sharing a group id would start from "
            "different init states",
            ("assignment", "init_states", "mode") if spec.wrote("assignment", "init_states") else base,
            "use init_states.mode: cycle (or fixed)",
        ))
    return out


def _tasks(spec: Spec, catalog: TaskCatalog | None, backend: Backend | None) -> list[Diagnostic]:
    out = []
    if spec.blocks is not None:
        out += _blocks(spec, catalog, backend)
        if spec.wrote("assignment", "tasks"):
            out.append(error("tasks-and-blocks", "give either tasks or blocks, not both",
                             ("assignment", "blocks"), "blocks lay out workers explicitly; remove tasks"))
        return out
    tasks = task_list(spec, catalog)
    path = ("assignment", "tasks")
    for i, item in enumerate(spec.task_items):
        if isinstance(item, str) and item != "all" and not parse_task_item(item):
            lo, _, hi = (part.strip() for part in item.partition("-"))
            out.append(error("task-range-empty", f"task range {item!r} is empty ({lo} > {hi})",
                             path + (i,) if spec.tasks_listed else path, f"write it {hi}-{lo}"))
    if not spec.wrote("assignment", "tasks") and catalog is not None:
        out.append(error("tasks-missing", f"backend {spec.backend!r} runs one of its {len(catalog.ids)} tasks in each "
                         "worker, but the spec assigns none", ("assignment",),
                         f"add assignment.tasks: all (or ids such as 0-{len(catalog.ids) - 1}), or assignment.blocks"))
    if spec.tasks_all and catalog is None and backend is not None:
        out.append(error("tasks-all-unknown", f"backend {spec.backend!r} has no task catalog, so 'all' means nothing",
                         path, "list the task ids"))
    if spec.tasks is not None:
        dup = sorted(t for t, n in Counter(spec.tasks).items() if n > 1)
        if dup:
            out.append(warning("task-duplicate", f"task id(s) {ids_text(dup)} listed more than once: they get more workers",
                               path, "list each task once"))
        if catalog is not None:
            unknown = sorted({t for t in spec.tasks if t not in catalog})
            if unknown:
                out.append(error("task-unknown", f"task id(s) {ids_text(unknown)} do not exist: {catalog.source or spec.backend} "
                                 f"has {len(catalog.ids)} tasks, {ids_text(catalog.ids)}", path,
                                 f"use ids in {ids_text(catalog.ids)}"))
    for t in spec.instructions:
        if tasks and t not in tasks:
            out.append(warning("instruction-unused", f"an instruction is given for task {t}, which no worker runs",
                               ("assignment", "instructions", t), f"tasks are {ids_text(tasks)}"))
    if not tasks:
        return out
    g = spec.groups
    total = spec.total_workers
    units = total // g.size if g.parallel_repeats else total
    unit_name = f"{units} group worker(s) ({total} workers // group size {g.size})" if g.parallel_repeats else f"{total} workers"
    n = len(tasks)
    if units < n:
        dropped = tasks[units:]
        out.append(error(
            "task-coverage",
            f"{unit_name} cannot cover {n} tasks: tasks {ids_text(dropped)} would get no worker",
            path, f"use at least {n * (g.size if g.parallel_repeats else 1)} workers, or fewer tasks",
        ))
    elif units % n and not (g.parallel_repeats and any(m % g.size for m in spec.workers)):
        # (with groups that do not divide the workers, the group-size error says what to fix first)
        more = units % n
        few = f"task {tasks[0]} gets" if more == 1 else f"tasks {ids_text(tasks[:more])} get"
        out.append(warning(
            "task-coverage-uneven",
            f"{unit_name} over {n} tasks is uneven ({units} % {n} = {more}): {few} "
            f"{units // n + 1}, the others {units // n}",
            path, f"use a multiple of {n * (g.size if g.parallel_repeats else 1)} workers for even coverage",
        ))
    return out


def _blocks(spec: Spec, catalog: TaskCatalog | None, backend: Backend | None) -> list[Diagnostic]:
    out = []
    for i, b in enumerate(spec.blocks):
        for key in sorted(set(b.kwargs) & (backend.catalog_keys if backend else frozenset())):
            out.append(error("block-changes-catalog", f"block {i} sets {key}, but its task ids and instructions are "
                             f"resolved against env.kwargs.{key}", ("assignment", "blocks", i, "kwargs", key),
                             f"use one {key} per spec (one spec per suite)"))
    total = sum(b.workers for b in spec.blocks)
    path = ("assignment", "blocks")
    if total != spec.total_workers:
        sizes = " + ".join(str(b.workers) for b in spec.blocks)
        out.append(error("blocks-total", f"blocks lay out {sizes} = {total} workers but the topology has "
                         f"{spec.total_workers} ({' + '.join(map(str, spec.workers))})", path,
                         "make the block worker counts add up to the topology"))
    start = 0
    g = spec.groups
    for i, b in enumerate(spec.blocks):
        if catalog is not None and b.task not in catalog:
            out.append(error("task-unknown", f"task {b.task} does not exist: {catalog.source or spec.backend} "
                             f"has {len(catalog.ids)} tasks, {ids_text(catalog.ids)}", path + (i, "task"),
                             f"use ids in {ids_text(catalog.ids)}"))
        if g.parallel_repeats and b.workers % g.size:
            out.append(error("blocks-split-group", f"block {i} covers workers {start}-{start + b.workers - 1}, which splits "
                             f"a group of {g.size} ({b.workers} % {g.size} = {b.workers % g.size})",
                             path + (i, "workers"), f"give each block a multiple of {g.size} workers"))
        start += b.workers
    return out


def _init_states(spec: Spec, catalog: TaskCatalog | None) -> list[Diagnostic]:
    if catalog is None or not catalog.init_states:
        return []
    tasks = [b.task for b in spec.blocks] if spec.blocks else task_list(spec, catalog)
    short = sorted({t for t in tasks if t in catalog.init_states and spec.init_state_id >= catalog.init_states[t]})
    if not short:
        return []
    counts = sorted({catalog.init_states[t] for t in short})
    return [error("init-state-unknown", f"init state id {spec.init_state_id} does not exist for task(s) {ids_text(short)} "
                  f"({'/'.join(map(str, counts))} init states, ids 0-{counts[0] - 1})",
                  ("assignment", "init_states", "id"), f"use an id below {counts[0]}")]


def _seeds(spec: Spec) -> list[Diagnostic]:
    out = []
    path = ("assignment", "seeds")
    if spec.seed_list is not None:
        if len(spec.seed_list) != spec.total_workers:
            out.append(error("seeds-list-length", f"seeds.list has {len(spec.seed_list)} seeds for {spec.total_workers} workers",
                             path + ("list",), "give exactly one seed per worker, or use base/strategy"))
        big = sorted(s for s in set(spec.seed_list) if s >= SEED_LIMIT)
        if big:
            out.append(error("seed-overflow", f"seed(s) {ids_text(big)} in seeds.list do not fit in 63 bits (2**63 = "
                             f"{SEED_LIMIT})", path + ("list",), "use seeds below 2**63"))
        dup = sorted(s for s, n in Counter(spec.seed_list).items() if n > 1)
        if dup:
            out.append(error("seeds-duplicate", f"seed(s) {ids_text(dup)} appear more than once in seeds.list: "
                             "workers would share a random stream", path + ("list",), "make every seed distinct"))
        if spec.wrote(*path, "strategy") or spec.wrote(*path, "base"):
            out.append(error("seeds-list-and-strategy", "seeds.list replaces base/strategy; give one or the other",
                             path, "remove base/strategy, or remove list"))
    elif spec.seed_strategy == "offset" and spec.seed_base + spec.total_workers > SEED_LIMIT:
        out.append(error("seed-overflow", f"base {spec.seed_base} + {spec.total_workers} workers exceeds 2**63",
                         path + ("base",), "use a smaller base seed"))
    return out


def _start_methods(spec: Spec, backend: Backend | None) -> list[Diagnostic]:
    out = []
    available = multiprocessing.get_all_start_methods()
    for role, method in (("subcollectors", spec.start_subcollectors), ("workers", spec.start_workers)):
        if method not in available:
            out.append(error("start-method-unavailable", f"start method {method!r} is not available on this platform "
                             f"(available: {', '.join(available)})", ("topology", "start_method", role), "use spawn"))
    if backend is not None and spec.start_workers == "fork" and backend.uses_gl(spec.env_kwargs):
        out.append(warning("fork-with-rendering", f"env workers of {spec.backend!r} render with GL/EGL; forked, each "
                           "starts as a copy of its subcollector: topo keeps GL out of it, but not the threads, pipes "
                           "or CUDA state that other code there may hold", ("topology", "start_method", "workers"),
                           "forkserver (the default) starts every worker clean, for one more import per subcollector; "
                           "measure both on your node: topo bench SPEC --modes forkserver-preload,fork"))
    if spec.wrote("topology", "start_method", "preload") and spec.preload and spec.start_workers != "forkserver":
        out.append(warning("preload-unused", f"preload only applies to forkserver env workers, not {spec.start_workers!r}",
                           ("topology", "start_method", "preload"), "remove preload, or use workers: forkserver"))
    return out


def _schema_kwargs(spec: Spec, backend: Backend | None) -> list[Diagnostic]:
    """Worker metadata needs one tensor schema per subcollector: blocks may not change schema kwargs in one."""
    if backend is None or not spec.blocks:
        return []
    out = []
    start = 0
    spans = []
    for i, b in enumerate(spec.blocks):
        spans.append((start, start + b.workers, i, b))
        start += b.workers
    for c, (first, count) in enumerate(zip(spec.offsets, spec.workers)):
        values: dict[str, dict[Any, list[int]]] = {}
        for lo, hi, i, b in spans:
            if hi <= first or lo >= first + count:
                continue
            effective = backend.env_kwargs(spec.env_kwargs, Assignment(
                c, 0, lo, b.task, None, 0, None, "episode", None, "random", 0, None, b.kwargs))
            for key in backend.schema_keys:
                value = effective.get(key, b.kwargs.get(key, spec.env_kwargs.get(key)))
                values.setdefault(key, {}).setdefault(repr(value), []).append(i)
        for key, by_value in sorted(values.items()):
            if len(by_value) > 1:
                parts = "; ".join(f"{v} in block(s) {ids_text(ix)}" for v, ix in by_value.items())
                members = [i for ix in by_value.values() for i in ix]
                first_block = min((i for i in members if key in spec.blocks[i].kwargs), default=min(members))
                out.append(error("schema-kwargs-differ", f"subcollector {c} mixes {key}: {parts}. Worker metadata needs "
                                 "one tensor schema per subcollector", ("assignment", "blocks", first_block, "kwargs", key),
                                 f"give every worker of subcollector {c} the same {key}, or align blocks with subcollectors"))
    return out


def _launch(spec: Spec, backend: Backend | None) -> list[Diagnostic]:
    out = []
    path = ("launch",)
    if spec.use_buffers and spec.metadata_from_workers:
        out.append(error("use-buffers-with-worker-metadata", "use_buffers: true needs the specs before workers start, "
                         "but metadata_from_workers reads them from the started workers; torchrl cannot do both",
                         path + ("use_buffers",), "remove use_buffers (worker metadata is what keeps envs out of parents)"))
    if not spec.metadata_from_workers:
        out.append(warning("parent-env-construction", f"metadata_from_workers: false makes each of the {spec.subcollectors} "
                           "subcollector(s) build one throwaway env in its own process to read specs",
                           path + ("metadata_from_workers",), "leave it true unless you are benchmarking"))
    k = spec.max_concurrent_starts
    if k is not None and k >= spec.total_workers:
        out.append(warning("max-concurrent-starts-unused", f"max_concurrent_starts {k} >= {spec.total_workers} workers: "
                           "it never limits anything", path + ("max_concurrent_starts",), "lower it or remove it"))
    if len(spec.workers) != spec.subcollectors:
        return out  # workers-list-length: the batch arithmetic would count the wrong subcollectors
    fpb_path = ("collector", "frames_per_batch")
    per_sub = spec.frames_per_batch
    if spec.sync:
        if spec.frames_per_batch % spec.subcollectors:
            out.append(error("frames-per-batch-split", f"frames_per_batch {spec.frames_per_batch} does not split over "
                             f"{spec.subcollectors} subcollectors ({spec.frames_per_batch} % {spec.subcollectors} = "
                             f"{spec.frames_per_batch % spec.subcollectors})", fpb_path,
                             f"use a multiple of {spec.subcollectors}"))
            return out
        per_sub = spec.frames_per_batch // spec.subcollectors
    for m in sorted(set(spec.workers)):
        if per_sub % m:
            what = f"{spec.frames_per_batch} / {spec.subcollectors} = {per_sub}" if spec.sync else str(per_sub)
            out.append(error("frames-per-batch-split", f"each subcollector collects {what} frames per batch, not a "
                             f"multiple of its {m} workers ({per_sub} % {m} = {per_sub % m})", fpb_path,
                             "a subcollector batch of F frames over M workers is [M, F/M]: make F a multiple of M"))
    return out


def _render_devices(spec: Spec, backend: Backend | None) -> list[Diagnostic]:
    """render_gpus or render_devices: one of them, a numbering the backend's builder resolves, and a fallback
    only where it means something."""
    devices = spec.wrote("assignment", "render_devices")
    path = ("assignment", "render_devices") if devices else ("assignment", "render_gpus")
    out = []
    if devices and spec.wrote("assignment", "render_gpus"):
        out.append(error("render-devices-twice", "render_gpus and render_devices both name the render devices", path,
                         "keep one: render_gpus: [0, 1] is render_devices: {ids: [0, 1], numbering: cuda}"))
    if spec.render_gpus and backend is not None and not backend.uses_gl(spec.env_kwargs):
        out.append(warning("render-gpus-unused", f"backend {spec.backend!r} does not render, {path[-1]} has no effect",
                           path, f"remove {path[-1]}"))
    elif spec.render_gpus and backend is not None and spec.render_numbering not in backend.render_numberings:
        out.append(error("render-numbering-unsupported", f"backend {spec.backend!r} resolves render devices from "
                         f"{' or '.join(backend.render_numberings)} indices, not {spec.render_numbering}",
                         path + ("numbering",), "use numbering: cuda (CUDA indices, as torch and nvidia-smi count)"))
    if spec.render_fallback and spec.render_numbering != "egl":
        out.append(error("render-fallback-needs-egl", "device_zero_fallback applies to EGL ids (vla_grpo's "
                         "render_gpu_device_zero_fallback); CUDA ids are mapped to the EGL device showing them",
                         path + ("device_zero_fallback",), "set numbering: egl, or remove device_zero_fallback"))
    return out
