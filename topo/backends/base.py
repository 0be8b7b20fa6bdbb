"""A backend: everything topo knows about an environment family without building it.

Its schema checks and reserved kwargs (validate), its task catalog and each worker's constructor kwargs
(plan), the batch keys the first-batch check reads (launch), what ``topo doctor`` imports, reports and
checks, and a worker's memory. A backend is pure: it never imports torch, torchrl or a simulator at
module level. Its runtime half is a ``builder`` (``"module:function"``) that the env worker imports and
calls with the plan row's ``kwargs["env"]``; see :mod:`topo.worker`. Adding a family is one backend
class plus its builder; a third-party package registers its class under the ``topo.backends`` entry
point group (:mod:`topo.backends`).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from topo.checks import Check
from topo.diagnostics import Diagnostic, error, ids_text


@dataclass(frozen=True)
class TaskCatalog:
    """Tasks a backend knows about: ids, their language, how many init states each has. A union of suites
    (:meth:`union`) keys them ``"suite:id"`` and keeps each suite's own catalog in ``parts``."""

    ids: tuple[int | str, ...]
    language: Mapping[int | str, str] = field(default_factory=dict)
    init_states: Mapping[int | str, int] = field(default_factory=dict)
    source: str = ""
    parts: Mapping[str, "TaskCatalog"] = field(default_factory=dict)

    def __contains__(self, task_id: int | str) -> bool:
        return task_id in self.ids

    @classmethod
    def union(cls, parts: Mapping[str, "TaskCatalog"]) -> "TaskCatalog":
        """Several suites' catalogs as one, keyed ``"suite:id"``."""
        def keyed(attr: str) -> dict:
            return {f"{name}:{i}": v for name, part in parts.items() for i, v in getattr(part, attr).items()}

        return cls(tuple(f"{name}:{i}" for name, part in parts.items() for i in part.ids), keyed("language"),
                   keyed("init_states"), " + ".join(parts), dict(parts))

    def extent(self, keys: Sequence[int | str] = (), name: str = "") -> tuple[str, str]:
        """What exists, for a message about ``keys`` that do not: ``("libero_spatial has 10 tasks, 0-9",
        "use ids in 0-9")`` (``name``: the catalog's when it has no source); in a union, the suites of ``keys``."""
        if not self.parts:
            return f"{self.source or name} has {len(self.ids)} tasks, {ids_text(self.ids)}", \
                f"use ids in {ids_text(self.ids)}"
        named = [self.parts[s] for s in dict.fromkeys(str(k).partition(":")[0] for k in keys) if s in self.parts]
        named = named or list(self.parts.values())
        return "; ".join(p.extent()[0] for p in named), \
            "use " + ", ".join(f"{p.source}:{ids_text(p.ids)}" for p in named)


class Assignment(NamedTuple):
    """One worker's assignment, before the backend turns it into constructor kwargs."""

    subcollector: int
    index: int
    global_index: int
    task_id: int | None
    instruction: str | None
    group_id_offset: int
    group_repeats: int | None
    group_id_mode: str
    seed: int | None
    init_state_mode: str
    init_state_id: int
    render_gpu: int | None
    kwargs: Mapping[str, Any] = {}  # a block's own kwargs, over the shared ones (never mutated)


class BatchKeys(NamedTuple):
    """Keys of a collected batch that show a worker's plan row (None: never look). The defaults are torchrl's
    VLA envs' (ToyVLAEnv, LiberoEnv); a batch without them leaves nothing to check."""

    instruction: str | None = "language_instruction"  # the language instruction, one string per step
    group: str | None = "group_id"  # the GRPO group id, in the plan's blocks of ``topo.compiler.assign.GROUP_ID_OFFSET``


#: bytes of an instruction in an async request slot (utf-8, zero-padded): longer ones are refused at validate
INSTRUCTION_BYTES = 256


class Layout(NamedTuple):
    """What one env's observations and actions hold, declared without building it: ``collector.mode: async``
    sizes its shared-memory request slots from it (torchrl would build an env in the trainer to learn it).
    Keys are dotted (``"observation.image"``); each value is ``(shape, dtype)``, the dtype a torch name."""

    observation: Mapping[str, tuple[tuple[int, ...], str]]
    action: Mapping[str, tuple[tuple[int, ...], str]]
    instruction: str | None = "language_instruction"  # a string key the policy may read (None: the env has none)


class Backend:
    """Base class: subclasses set the class attributes and override what they need."""

    #: name used in specs (``env.backend``)
    name: str = ""
    #: runtime builder, imported inside the env worker: ``"module:function"``
    builder: str = ""
    #: True when the env creates a GL/EGL context (``fork`` for its workers is warned about)
    renders: bool = False
    #: shared kwargs whose value changes the tensor schema (must be equal in a subcollector)
    schema_keys: frozenset[str] = frozenset()
    #: shared kwargs that choose the task catalog (a block may not change them)
    catalog_keys: frozenset[str] = frozenset()
    #: the shared kwarg naming a task suite, where task ids may be qualified ``"suite:id"``; None: no suites
    suite_key: str | None = None
    #: how render device ids may be numbered for its builder: 'cuda' (CUDA indices), 'egl' (EGL device indices)
    render_numberings: tuple[str, ...] = ("cuda",)
    #: rough resident memory of one worker, for placement and doctor estimates (None: unknown)
    memory_per_worker_gb: float | None = None
    #: whether its catalog counts init states per task (eval.init_states chooses among them)
    has_init_states: bool = False
    #: the constructor kwarg that bounds an episode's steps (eval.max_episode_steps is written there); None:
    #: the env has none, and the eval worker truncates episodes itself (the plan's schedule says where)
    horizon_key: str | None = None
    #: options of the builder itself (``env.options``; never constructor kwargs): name -> (default, check, what)
    options: Mapping[str, tuple[Any, Callable[[Any], bool], str]] = {}
    #: shared kwargs topo sets per worker from the assignment: refused in ``env.kwargs`` (:meth:`check_kwargs`)
    reserved: frozenset[str] = frozenset()
    #: where a reserved kwarg is set instead
    reserved_hint: str = "use the assignment section"
    #: batch keys the launch compares with the plan rows on each subcollector's first batch
    batch_keys: BatchKeys = BatchKeys()
    #: ``topo doctor``: modules the builder needs beyond its own module and torchrl.envs
    imports: tuple[str, ...] = ()
    #: ``topo doctor``: distributions whose versions it reports
    distributions: tuple[str, ...] = ()
    #: ``topo doctor``: how to install what the imports need
    install_hint: str = 'pip install "topo[launch]"'

    def check_kwargs(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        """The shared kwargs: none that topo sets per worker, then the backend's own :meth:`check`."""
        path = tuple(path)
        out = []
        for key in env_kwargs:
            if key == "options" and self.options:
                out.append(error("kwargs-reserved", "'options' are topo's builder options, not constructor kwargs",
                                 path + (key,), "move them to env.options"))
            elif key in self.reserved:
                out.append(error("kwargs-reserved", f"{key!r} is set per worker by the assignment, not in env.kwargs",
                                 path + (key,), self.reserved_hint))
        return out + self.check(env_kwargs, path)

    def uses_gl(self, env_kwargs: Mapping[str, Any]) -> bool:
        """Whether workers built with these kwargs create a GL context."""
        return self.renders

    def observation_layout(self, env_kwargs: Mapping[str, Any]) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]] | None:
        """What a policy reads of one worker's observation, known without building the env: key -> (shape,
        dtype name; ``"str"`` for a string), from :meth:`layout`. None: unknown (the inference server's requests
        then go through torchrl's manager-backed queue)."""
        layout = self.layout(env_kwargs)
        if layout is None:
            return None
        keys = {tuple(key.split(".")): spec for key, spec in layout.observation.items()}
        if layout.instruction:
            keys[(layout.instruction,)] = ((), "str")
        return keys

    def catalog(self, env_kwargs: Mapping[str, Any]) -> TaskCatalog | None:
        """Tasks this env family offers, or None when it has no notion of tasks."""
        return None

    def check_suite(self, suite: str, path: Sequence[str | int]) -> list[Diagnostic]:
        """Whether ``suite`` (named by a qualified task id at ``path``) is one whose catalog can be read."""
        return []

    def suites_catalog(self, env_kwargs: Mapping[str, Any], suites: Sequence[str]) -> TaskCatalog | None:
        """The tasks of several suites, keyed ``"suite:id"`` (None when one of them has no catalog)."""
        parts = {s: self.catalog({**env_kwargs, self.suite_key: s}) for s in suites}
        return None if any(p is None for p in parts.values()) else TaskCatalog.union(parts)

    def layout(self, env_kwargs: Mapping[str, Any]) -> Layout | None:
        """The observation and action layout of workers built with these shared kwargs; None: unknown without
        building an env (``collector.mode: async`` is then refused at validate)."""
        return None

    def check(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        """Backend-specific diagnostics on the shared kwargs (``path`` locates them), reserved keys aside."""
        return []

    def host_facts(self) -> dict[str, Any]:
        """``topo doctor``: what this host's installation says (JSON), read in the import probe after the imports."""
        return {}

    def host_checks(self, plan: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Check]:
        """``topo doctor``: the backend's own checks of this host for ``plan`` (files, configs), given :meth:`host_facts`."""
        return []

    def default_instruction(self, task_id: int | None, catalog: TaskCatalog | None) -> str | None:
        """The instruction a worker gets when the spec overrides none."""
        if catalog is not None and task_id is not None:
            return catalog.language.get(task_id)
        return None

    def env_kwargs(self, shared: Mapping[str, Any], a: Assignment) -> dict[str, Any]:
        """The exact constructor kwargs of one worker (JSON-serialisable)."""
        raise NotImplementedError

    def check_options(self, options: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        """``env.options``: known names, each of the type its check accepts."""
        path = tuple(path)
        if options and not self.options:
            return [error("options-unknown", f"backend {self.name!r} takes no builder options", path,
                          "remove env.options")]
        out = []
        for key, value in options.items():
            if key not in self.options:
                close = difflib.get_close_matches(key, self.options, n=1)
                out.append(error("options-unknown", f"backend {self.name!r} has no builder option {key!r}", path + (key,),
                                 (f"did you mean {close[0]!r}? " if close else "") + "options: " + ", ".join(self.options)))
            elif not self.options[key][1](value):
                out.append(error("options-type", f"{key} must be {self.options[key][2]}, got {value!r}", path + (key,)))
        return out

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every option with its value: the spec's over the defaults (what a plan row records)."""
        return {key: options.get(key, default) for key, (default, _, _) in self.options.items()}
