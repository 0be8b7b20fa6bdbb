"""The spec as typed data, with defaults filled in. Built only from schema-valid data."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Union

from topo.compiler import protocols

START_METHODS = ("spawn", "forkserver", "fork")
DEFAULT_STARTUP_TIMEOUT = 900.0
DEFAULT_WORKER_START = "forkserver"  # with preload: 16-23 % faster to ready than spawn (benchmarks/results/)

#: a task's key in the compiler: its id in env.kwargs.task_suite, or ``"suite:id"`` in a multi-suite spec (where
#: ``"suite:all"`` also stands, in task lists, for every task of that suite until the catalog expands it)
TaskKey = Union[int, str]
QUALIFIED = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*:\s*(all|[0-9]{1,18}(?:\s*-\s*[0-9]{1,18})?)\s*$")


@dataclass(frozen=True)
class Groups:
    size: int = 1
    candidate_size: int = 1
    parallel_repeats: bool = False
    declared: bool = False  # the spec has a groups section (group_repeats is then set)


@dataclass(frozen=True)
class Block:
    task: TaskKey
    workers: int
    instruction: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Policy:
    """The ``policy`` section: a factory and where it runs."""

    factory: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    placement: str = "subcollector"
    device: str | None = None
    weight_sync: str = "shared_mem"


@dataclass(frozen=True)
class Transform:
    """One item of ``env.transforms``: a torchrl transform (``A`` or ``A.ctor``) or a ``module:callable``, its kwargs,
    and its index in the list as written."""

    name: str
    kwargs: Mapping[str, Any]
    index: int

    def plan_entry(self) -> dict[str, Any]:
        """The item as a plan carries it."""
        return {"name": self.name, "kwargs": dict(self.kwargs)}


@dataclass(frozen=True)
class Recycle:
    """Health budgets (``launch.recycle``): None leaves one unchecked."""

    max_rss_gb: float | None = None
    max_latency_drift: float | None = None
    max_episodes: int | None = None
    check_every: int = 1


@dataclass(frozen=True)
class Request:
    """Resources as written in the placement section: None where a key is not written."""

    cpus: float | None = None
    gpus: float | None = None
    memory_gb: float | None = None
    custom: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Override:
    """One entry of placement.overrides: the subcollectors it names and what they ask for instead."""

    subcollectors: tuple[int, ...]  # the indices its items name, in order
    resources: Request


@dataclass(frozen=True)
class Node:
    """A kind of cluster node declared in placement.nodes (a resource None: not declared)."""

    name: str
    count: int = 1
    cpus: float | None = None
    gpus: float | None = None
    memory_gb: float | None = None
    custom: Mapping[str, float] = field(default_factory=dict)

    def capacity(self, key: str) -> float | None:
        """None: not declared (unbounded on paper); custom resources a node lacks are 0."""
        if key in ("cpus", "gpus", "memory_gb"):
            return getattr(self, key)
        return self.custom.get(key, 0)


@dataclass(frozen=True)
class Placement:
    """The ``placement`` section: where subcollectors run and what each asks for."""

    engine: str = "local"
    address: str = "auto"
    runtime_env: Mapping[str, Any] = field(default_factory=dict)
    run_dir: str = "per_node"  # per_node: each node's records pulled through Ray; shared: one directory all nodes mount
    resources: Request = Request()
    overrides: tuple[Override, ...] = ()
    nodes: tuple[Node, ...] = ()
    server: Request = Request()  # the inference server's actor (policy.placement: server)


@dataclass(frozen=True)
class Eval:
    """The ``eval`` section: what one evaluation runs (each (task, init state) ``trials`` times) and on what."""

    tasks: tuple[TaskKey, ...] | None = None  # None: 'all' (tasks_all) or not written (the training tasks)
    tasks_all: bool = False
    task_items: tuple[int | str, ...] = ()  # eval.tasks as written, one entry per item
    tasks_listed: bool = False
    init_states: tuple[int, ...] | None = None  # None: 'all' (every init state of each task's catalog entry)
    init_state_items: tuple[int | str, ...] = ()
    init_states_listed: bool = False
    trials: int = 1
    workers: tuple[int, ...] | None = None  # workers per eval subcollector; None: the default (one per eval task)
    subcollectors: int | None = None  # as written in workers: {subcollectors: n, ...}; None: one
    workers_listed: bool = False  # workers_per_subcollector is written as a list
    render_gpus: tuple[int, ...] | None = None
    render_numbering: str = "cuda"
    render_fallback: bool = False
    seed_base: int | None = None  # None: the default stream (topo.compiler.eval_plan.seed_stream)
    seed_strategy: str | None = None  # None: the training's (offset when training lists its seeds)
    max_episode_steps: int | None = None
    every: int | None = None
    run_async: bool = False  # eval.async
    busy_policy: str = "skip"
    exploration: str = "deterministic"
    policy: str = "copy"
    protocol: Mapping[str, Any] | None = None  # eval.protocol written out (topo.compiler.protocols.expand)
    variants: Mapping[str, str] = field(default_factory=dict)  # eval.variants: each perturbed suite's base suite

    def horizon(self, task: Any) -> int | None:
        """Steps an episode of ``task`` runs at most: its suite's under a protocol, else max_episode_steps."""
        if self.protocol and isinstance(task, str):
            return self.protocol["horizons"].get(task.partition(":")[0])
        return self.max_episode_steps


@dataclass(frozen=True)
class Spec:
    name: str
    backend: str
    env_kwargs: dict[str, Any]
    env_options: dict[str, Any]  # the builder's own options (env.options), as written
    subcollectors: int
    workers: tuple[int, ...]  # workers per subcollector
    workers_listed: bool  # workers_per_subcollector is written as a list
    start_subcollectors: str
    start_workers: str
    preload: bool  # forkserver env workers: the server imports the heavy modules once
    tasks: tuple[TaskKey, ...] | None  # None: the backend's whole catalog ('all') or no tasks
    tasks_all: bool
    task_items: tuple[int | str, ...]  # assignment.tasks as written, one entry per item ('all' included)
    tasks_listed: bool  # assignment.tasks is written as a list
    instructions: dict[TaskKey, str]
    blocks: tuple[Block, ...] | None
    groups: Groups
    init_state_mode: str
    init_state_id: int
    seed_base: int
    seed_strategy: str
    seed_list: tuple[int, ...] | None
    render_gpus: tuple[int, ...] | None  # render device ids, one per subcollector (cycled), in render_numbering
    render_numbering: str  # 'cuda' (mapped to the EGL device showing it) or 'egl' (EGL device indices)
    render_fallback: bool  # egl: the device-zero fallback when EGL sees fewer devices than an id needs
    sync: bool
    frames_per_batch: int
    total_frames: int
    startup_timeout: float
    shutdown_timeout: float | None
    max_concurrent_starts: int | None
    restarts_max: int  # subcollector restarts allowed while collecting (0: a failure ends the run)
    restarts_window: float | None  # ... within any window of this many seconds (None: the whole run)
    hang_timeout: float | None  # seconds in one env step (or a subcollector without a step) that make a hang
    stall_timeout: float | None  # seconds without a batch while one is owed that make a stall (None: no watchdog)
    on_stall: str  # "warn" (name it on stderr) or "fail" (end the run with it)
    provenance: bool  # every step carries its episode id; each episode recorded in the run directory
    record_actions: bool  # env workers keep each episode's actions and step digests (topo replay)
    retain_episodes: int | None  # each worker life's records keep its last N episodes (None: all)
    recycle: Recycle | None  # health budgets checked between batches (None: no recycle section)
    metadata_from_workers: bool
    use_buffers: bool
    policy: Policy | None = None
    mode: str = "multi"  # collector.mode: 'multi' (torchrl's multi collectors) or 'async' (one AsyncBatchedCollector)
    placement: Placement = Placement()
    eval: Eval | None = None  # None: no eval section
    transforms: tuple[Transform, ...] = ()  # env.transforms, the well-formed items (first applied first)
    transforms_at: str = "worker"  # 'worker' (in each env worker) or 'subcollector' (over its ParallelEnv)
    written: frozenset[tuple[str, ...]] = frozenset()  # key paths the spec gives a value, down to the third level
    suites: tuple[str, ...] = ()  # a multi-suite spec's suites (env.kwargs.task_suite first); (): one suite, int keys
    qualified: tuple[tuple[tuple, str], ...] = ()  # (path, item) of every task item written 'suite:...'

    def keys_of(self, item: int | str) -> list[TaskKey]:
        """The task keys one task item names, as this spec reads them."""
        return Keys(self.env_kwargs.get("task_suite"), self.suites).of(item)

    def wrote(self, *path: str) -> bool:
        """Whether the spec gives this key a value (not null), rather than leaving it to its default."""
        return path in self.written

    def transform_stack(self, row: bool = False) -> list[dict[str, Any]] | None:
        """``env.transforms`` as a plan carries it (None without transforms); ``row``: as each worker row's kwargs carry
        it (None unless the stack is placed in workers)."""
        if not self.transforms or (row and self.transforms_at != "worker"):
            return None
        return [t.plan_entry() for t in self.transforms]

    @property
    def total_workers(self) -> int:
        return sum(self.workers)

    @property
    def offsets(self) -> tuple[int, ...]:
        """Global index of each subcollector's first worker."""
        out, acc = [], 0
        for n in self.workers:
            out.append(acc)
            acc += n
        return tuple(out)


def parse_task_item(item: int | str) -> list[int]:
    if isinstance(item, int) or "-" not in item:
        return [int(item)]
    lo, _, hi = item.partition("-")
    lo_i, hi_i = int(lo), int(hi)
    return list(range(lo_i, hi_i + 1))


def parse_items(items: Any) -> tuple[int, ...]:
    """The ids of one item or a list of items (ids and ranges 'a-b')."""
    return tuple(i for item in (items if isinstance(items, list) else [items]) for i in parse_task_item(item))


def split_item(item: int | str) -> tuple[str | None, int | str] | None:
    """``(suite, rest)`` of a task item (suite None: unqualified); None for a malformed qualified one."""
    if not isinstance(item, str) or ":" not in item:
        return None, item
    m = QUALIFIED.match(item)
    return (m.group(1), m.group(2)) if m else None


def empty_range(item: int | str) -> tuple[str, str, str] | None:
    """``(lo, hi, the range the right way round)`` of a range item (qualified or not) that names no ids; None
    otherwise."""
    split = split_item(item)
    rest = split[1] if split else None
    if not isinstance(rest, str) or "-" not in rest:
        return None
    lo, _, hi = (part.strip() for part in rest.partition("-"))
    return (lo, hi, f"{split[0] + ':' if split[0] else ''}{hi}-{lo}") if int(lo) > int(hi) else None


class Keys:
    """Task items to keys: ints in a one-suite spec, ``"suite:id"`` once an item names another suite than
    ``default`` (env.kwargs.task_suite), unqualified items then meaning ``default``."""

    def __init__(self, default: str | None, named: tuple[str, ...]):
        self.default = default
        self.suites = tuple(dict.fromkeys(([default] if default else []) + list(named))) if set(named) - {default} else ()

    def of(self, item: int | str) -> list[TaskKey]:
        """The keys of one item: ``"all"`` stays a marker (``"suite:all"`` when multi-suite); malformed: none."""
        split = split_item(item)
        if split is None:
            return []
        suite, rest = split
        ids: list = ["all"] if rest == "all" else parse_task_item(rest)
        return [f"{suite or self.default}:{i}" for i in ids] if self.suites else ids

    def items(self, raw: Any) -> tuple[TaskKey, ...]:
        return tuple(k for item in _items(raw) for k in self.of(item))


def _task_items(data: Mapping[str, Any]) -> Iterator[tuple[tuple, Any]]:
    """(path, item) of every task item of the spec: assignment.tasks, blocks' tasks, instructions' keys, eval.tasks."""
    assign = data.get("assignment") or {}
    evaluate = data.get("eval") if isinstance(data.get("eval"), dict) else {}
    for path, raw in ((("assignment", "tasks"), assign.get("tasks")), (("eval", "tasks"), evaluate.get("tasks"))):
        for i, item in enumerate(_items(raw)):
            yield (path + (i,) if isinstance(raw, list) else path), item
    for i, block in enumerate(assign.get("blocks") or ()):
        yield ("assignment", "blocks", i, "task"), block.get("task")
    for key in assign.get("instructions") or {}:
        yield ("assignment", "instructions", key), key


def _qualified(data: Mapping[str, Any]) -> tuple[tuple[tuple, str], ...]:
    return tuple((path, item) for path, item in _task_items(data) if isinstance(item, str) and ":" in item)


def _named_suites(qualified: tuple[tuple[tuple, str], ...]) -> tuple[str, ...]:
    """Every suite the well-formed qualified items name, in the order they are first written."""
    return tuple(dict.fromkeys(split[0] for split in (split_item(item) for _, item in qualified) if split))


def from_data(data: Mapping[str, Any]) -> Spec:
    """Fill defaults. ``data`` must already satisfy the JSON Schema; an eval protocol is written out first."""
    data = protocols.expand(data)
    env = data["env"]
    topo = data["topology"]
    assign = data.get("assignment") or {}
    collector = data.get("collector") or {}
    launch = data.get("launch") or {}
    n_sub = topo["subcollectors"]
    wps = topo["workers_per_subcollector"]
    workers = tuple(wps) if isinstance(wps, list) else (wps,) * n_sub
    start = topo.get("start_method") or {}

    suite = (env.get("kwargs") or {}).get("task_suite")
    qualified = _qualified(data)
    keys = Keys(suite if isinstance(suite, str) else None, _named_suites(qualified))
    tasks_raw = assign.get("tasks")
    tasks_all = tasks_raw == "all" and not keys.suites
    tasks = keys.items(tasks_raw) if tasks_raw is not None and not tasks_all else None
    blocks = None
    if assign.get("blocks"):
        blocks = tuple(Block((keys.of(b["task"]) or [None])[0], b["workers"], b.get("instruction"), b.get("kwargs") or {})
                       for b in assign["blocks"])

    g = assign.get("groups")
    groups = Groups()
    if g is not None:
        size = g.get("size", 1)
        groups = Groups(size, g.get("candidate_size", size), g.get("parallel_repeats", False), True)
    init = assign.get("init_states") or {}
    seeds = assign.get("seeds") or {}
    devices = assign.get("render_devices") or {}
    gpus = assign.get("render_gpus") or devices.get("ids")
    sync = collector.get("sync", True)
    mode = collector.get("mode", "multi")
    policy = data.get("policy")
    return Spec(
        name=data.get("name", "topology"),
        backend=env["backend"],
        env_kwargs=dict(env.get("kwargs") or {}),
        env_options=dict(env.get("options") or {}),
        subcollectors=n_sub,
        workers=workers,
        workers_listed=isinstance(wps, list),
        start_subcollectors=start.get("subcollectors", "forkserver"),
        start_workers=start.get("workers", DEFAULT_WORKER_START),
        preload=start.get("preload", True),
        tasks=tasks,
        tasks_all=tasks_all,
        task_items=() if tasks_raw is None else tuple(tasks_raw) if isinstance(tasks_raw, list) else (tasks_raw,),
        tasks_listed=isinstance(tasks_raw, list),
        instructions={key[0]: v for k, v in (assign.get("instructions") or {}).items() if len(key := keys.of(k)) == 1},
        blocks=blocks,
        groups=groups,
        init_state_mode=init.get("mode", "random"),
        init_state_id=init.get("id", 0),
        seed_base=seeds.get("base", 0),
        seed_strategy=seeds.get("strategy", "offset"),
        seed_list=tuple(seeds["list"]) if "list" in seeds else None,
        render_gpus=tuple(gpus) if gpus else None,
        render_numbering=devices.get("numbering", "cuda"),
        render_fallback=devices.get("device_zero_fallback", False),
        sync=sync,
        frames_per_batch=collector.get("frames_per_batch") or default_frames_per_batch(workers, sync or mode == "async"),
        mode=mode,
        total_frames=collector.get("total_frames", -1),
        startup_timeout=float(launch.get("startup_timeout", DEFAULT_STARTUP_TIMEOUT)),
        shutdown_timeout=launch.get("shutdown_timeout"),
        max_concurrent_starts=launch.get("max_concurrent_starts"),
        restarts_max=(launch.get("restarts") or {}).get("max", 0),
        restarts_window=(launch.get("restarts") or {}).get("window"),
        hang_timeout=launch.get("hang_timeout"),
        stall_timeout=launch.get("stall_timeout"),
        on_stall=launch.get("on_stall", "warn"),
        provenance=bool(launch.get("provenance", True)),
        record_actions=bool(launch.get("record_actions", False)),
        retain_episodes=launch.get("retain_episodes"),
        recycle=Recycle(**launch["recycle"]) if isinstance(launch.get("recycle"), dict) else None,
        metadata_from_workers=launch.get("metadata_from_workers", True),
        use_buffers=launch.get("use_buffers", False),
        policy=Policy(policy["factory"], dict(policy.get("kwargs") or {}), policy.get("placement", "subcollector"),
                      policy.get("device"), policy.get("weight_sync", "shared_mem")) if policy else None,
        placement=_placement(data.get("placement") or {}),
        eval=_eval(data["eval"], keys, data.get(protocols.KEY)) if isinstance(data.get("eval"), dict) else None,
        transforms=tuple(_transforms(env.get("transforms") or [])),
        transforms_at=env.get("transforms_at", "worker"),
        written=frozenset(_written(data, ())),
        suites=keys.suites,
        qualified=qualified,
    )


def _transforms(items: list) -> Iterator[Transform]:
    """The items that name one transform: a name, or a mapping of one name to its kwargs (a mapping or null)."""
    for i, item in enumerate(items):
        if isinstance(item, str) and item:
            yield Transform(item, {}, i)
        elif isinstance(item, dict) and len(item) == 1:
            (name, kwargs), = item.items()
            if isinstance(name, str) and name and isinstance(kwargs, (dict, type(None))):
                yield Transform(name, dict(kwargs or {}), i)


def _placement(data: Mapping[str, Any]) -> Placement:
    return Placement(
        engine=data.get("engine", "local"),
        address=data.get("address", "auto"),
        runtime_env=data.get("runtime_env") or {},
        run_dir=data.get("run_dir", "per_node"),
        resources=_request(data.get("resources")),
        overrides=tuple(Override(parse_items(o["subcollectors"]), _request(o["resources"]))
                        for o in data.get("overrides") or []),
        nodes=tuple(Node(n["name"], n.get("count", 1), n.get("cpus"), n.get("gpus"), n.get("memory_gb"),
                         n.get("custom") or {}) for n in data.get("nodes") or []),
        server=_request(data.get("server")),
    )


def _eval(data: Mapping[str, Any], keys: Keys, expanded: Mapping[str, Any] | None) -> Eval:
    protocol = expanded if expanded and expanded.get("name") else None
    tasks = data.get("tasks")
    states = data.get("init_states")
    workers = data.get("workers")
    subcollectors = None
    per_sub: Any = workers
    if isinstance(workers, dict):
        subcollectors = workers["subcollectors"]
        per_sub = workers["workers_per_subcollector"]
    listed = isinstance(per_sub, list)
    devices = data.get("render_devices") or {}
    gpus = data.get("render_gpus") or devices.get("ids")
    seeds = data.get("seeds") or {}
    return Eval(
        tasks=keys.items(tasks) if tasks is not None and (tasks != "all" or keys.suites) else None,
        tasks_all=tasks == "all" and not keys.suites,
        task_items=_items(tasks),
        tasks_listed=isinstance(tasks, list),
        init_states=parse_items(states) if states is not None and states != "all" else None,
        init_state_items=_items(states),
        init_states_listed=isinstance(states, list),
        trials=data.get("trials", 1),
        workers=None if per_sub is None else tuple(per_sub) if listed else (per_sub,) * (subcollectors or 1),
        subcollectors=subcollectors,
        workers_listed=listed,
        render_gpus=tuple(gpus) if gpus else None,
        render_numbering=devices.get("numbering", "cuda"),
        render_fallback=devices.get("device_zero_fallback", False),
        seed_base=protocol["seed"] if protocol else seeds.get("base"),
        seed_strategy="fixed" if protocol else seeds.get("strategy"),
        max_episode_steps=max(protocol["horizons"].values(), default=None) if protocol else data.get("max_episode_steps"),
        every=data.get("every"),
        run_async=data.get("async", False),
        busy_policy=data.get("busy_policy", "skip"),
        exploration=data.get("exploration", "deterministic"),
        policy=data.get("policy", "copy"),
        protocol=protocol,
        variants=dict((expanded or {}).get("variants") or {}),
    )


def _items(raw: Any) -> tuple:
    return () if raw is None else tuple(raw) if isinstance(raw, list) else (raw,)


def _request(data: Mapping[str, Any] | None) -> Request:
    data = data or {}
    return Request(data.get("cpus"), data.get("gpus"), data.get("memory_gb"), data.get("custom") or {})


def _written(data: Mapping[str, Any], path: tuple, depth: int = 3) -> Iterator[tuple]:
    for key, value in data.items():
        if value is not None:
            yield path + (key,)
        if depth > 1 and isinstance(value, dict):
            yield from _written(value, path + (key,), depth - 1)


def default_frames_per_batch(workers: tuple[int, ...], sync: bool) -> int:
    """One step of every worker: sync batches are totals, async batches are per subcollector."""
    per_sub = math.lcm(*workers)
    return per_sub * len(workers) if sync else per_sub
