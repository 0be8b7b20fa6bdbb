"""The plan-time half of a backend: what topo knows about an environment family without building it.

A backend is pure: it never imports torch, torchrl or a simulator. Its runtime half is a
``builder`` (``"module:function"``) that the env worker imports and calls with the plan row's
``kwargs["env"]``; see :mod:`topo.worker`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ..diagnostics import Diagnostic, error


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
    #: options of the builder itself (``env.options``; never constructor kwargs): name -> (default, check, what)
    options: Mapping[str, tuple[Any, Callable[[Any], bool], str]] = {}

    def uses_gl(self, env_kwargs: Mapping[str, Any]) -> bool:
        """Whether workers built with these kwargs create a GL context."""
        return self.renders

    def catalog(self, env_kwargs: Mapping[str, Any]) -> TaskCatalog | None:
        """Tasks this env family offers, or None when it has no notion of tasks."""
        return None

    def check(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        """Backend-specific diagnostics on the shared kwargs (``path`` locates them)."""
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
