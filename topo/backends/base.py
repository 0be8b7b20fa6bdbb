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
from topo.diagnostics import Diagnostic, error


@dataclass(frozen=True)
class TaskCatalog:
    """Tasks a backend knows about: ids, their language, how many init states each has."""

    ids: tuple[int, ...]
    language: Mapping[int, str] = field(default_factory=dict)
    init_states: Mapping[int, int] = field(default_factory=dict)
    source: str = ""

    def __contains__(self, task_id: int) -> bool:
        return task_id in self.ids


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
