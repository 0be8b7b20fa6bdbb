"""The training-script API: :func:`load` a spec or a saved plan into a :class:`Plan`, read it, save it,
build the trainer's policy from it, and hand it to :func:`topo.collector`.

Imports neither torch nor a simulator: :meth:`Plan.make_policy` imports the policy factory's module
only when it is called. Every check and every output is the CLI's own (:func:`topo.compiler.saved.resolve`,
:func:`topo.compiler.render.plan_text`, :func:`topo.compiler.plan.write`), so ``topo.load(x).dry_run()`` is what
``topo plan x --dry-run`` prints and ``plan.save(path)`` what ``topo plan x -o path`` writes.
"""
from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any, Callable, Mapping, TypedDict, Union, cast

from topo.compiler import plan as planmod
from topo.compiler import planfile
from topo.compiler.row import Row
from topo.errors import UsageError

if TYPE_CHECKING:
    from topo.launch.run import Run

__all__ = ["Plan", "PlanSource", "Row", "Subcollector", "collector", "eval_table", "load"]

PlanSource = Union[str, "os.PathLike[str]", "dict[str, Any]"]
"""What :func:`load` and :func:`topo.collector` take: a spec path (YAML or Jinja2), a saved plan's path, or a plan dict."""


class Subcollector(TypedDict):
    """One subcollector of a plan: its index, its worker count, its render GPU and its rows."""

    index: int
    num_workers: int
    render_gpu: int | None
    workers: list[Row]


class Plan:
    """A checked plan: one row per worker with its exact env kwargs. Make one with :func:`load`.

    The plan dict (``docs/reference/plan-format.md``) stays the truth: :attr:`data` is that dict itself (the one
    :func:`topo.collector` runs; change it and you change the plan, and a saved plan changed so is
    refused at launch), :meth:`to_dict` a copy. The properties read it; none of them copies or checks.
    """

    __slots__ = ("data", "allow_edited")

    def __init__(self, data: dict[str, Any], *, allow_edited: bool = False):
        """Wrap ``data`` as it is (no check: :func:`load` checks; :func:`topo.collector` checks again).

        ``allow_edited``: the plan was loaded with ``allow_edited=True``; :func:`topo.collector` runs it so too.
        """
        self.data = data
        self.allow_edited = allow_edited

    @property
    def name(self) -> str:
        """The spec's ``name``."""
        return cast(str, self.data["name"])

    @property
    def rows(self) -> list[Row]:
        """Every worker's row, in global order (``global_index`` 0, 1, ...): the plan's own dicts, in a new list."""
        return cast("list[Row]", list(planmod.rows(self.data)))

    @property
    def subcollectors(self) -> list[Subcollector]:
        """The subcollectors, in order, each with its rows (``workers``): the plan's own list."""
        return cast("list[Subcollector]", self.data["subcollectors"])

    @property
    def coverage(self) -> dict[str, Any]:
        """What the plan covers (tasks, groups, instructions, render devices): ``topo plan --dry-run``'s summary, as data."""
        return cast("dict[str, Any]", self.data["coverage"])

    @property
    def policy(self) -> dict[str, Any] | None:
        """The spec's ``policy`` section with its defaults (``factory``, ``kwargs``, ``placement``, ``device``,
        ``weight_sync``), or None when the spec has none (the envs then act at random)."""
        return cast("dict[str, Any] | None", self.data.get("policy"))

    @property
    def engine(self) -> str:
        """Where the subcollectors run: ``"local"`` (processes on this machine) or ``"ray"`` (Ray actors)."""
        return planmod.engine(self.data)

    def to_dict(self) -> dict[str, Any]:
        """A deep copy of the plan dict: plain JSON data."""
        return copy.deepcopy(self.data)

    def dry_run(self, *, limit: int | None = None, width: int = 120) -> str:
        """The assignment table and coverage summary: what ``topo plan SPEC --dry-run [--limit N]`` prints
        (``width``: the terminal's columns; the CLI uses 120 when its output is not a terminal)."""
        from topo.compiler import render

        return render.plan_text(self.data, "table", limit, width)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the plan to ``path`` as ``topo plan -o`` does: canonical JSON sealed with its digest, which
        ``topo launch PATH`` (and :func:`load`) check.

        A plan changed since topo wrote it (its digest no longer matches) is refused, not sealed anew:
        re-run ``topo plan -o`` (or :func:`load` and :meth:`save`) from the spec.
        """
        recorded = self.data.get("digest")
        if recorded is not None and recorded != planfile.digest(self.data):
            raise UsageError("this plan was changed after topo wrote it (its digest no longer matches): topo does not "
                             "seal an edited plan; re-run `topo plan -o` from the spec")
        planmod.write(self.data, os.fspath(path))

    def make_policy(self) -> Any:
        """The trainer's own copy of the policy: the plan's policy factory called with its kwargs.

        The acting copies (in each subcollector, or the inference server) come from the same factory;
        pass this one to :func:`topo.collector` as ``policy=`` and push its weights with
        ``run.update_weights()``. Imports the factory's module (and so torch) only now.
        Raises :class:`~topo.errors.UsageError` when the plan has no policy section.
        """
        section = self.policy
        if section is None:
            raise UsageError(f"plan {self.name!r} has no policy section: add `policy: {{factory: ..., kwargs: ...}}` to "
                             "the spec, or build the policy yourself and pass policy_factory= to topo.collector")
        from topo.runtime.builder import import_builder

        return import_builder(section["factory"])(**section["kwargs"])

    def __repr__(self) -> str:
        cov = self.data.get("coverage") or {}
        policy = self.policy
        return (f"<topo.Plan {self.data.get('name')!r}: {cov.get('subcollectors')} subcollector(s), "
                f"{cov.get('workers')} workers, backend {(self.data.get('env') or {}).get('backend')}, "
                f"engine {self.engine}, policy {policy['factory'] if policy else None}>")


def load(source: PlanSource | Plan, *, variables: Mapping[str, str] | None = None, spec: str | None = None,
         allow_edited: bool = False) -> Plan:
    """The :class:`Plan` of ``source``, checked as ``topo launch`` checks it.

    ``source`` is a spec's path (YAML, or a Jinja2 template rendered with ``variables``), a saved plan's
    path (refused when malformed, edited since topo wrote it, written by an incompatible topo, or stale:
    its spec, ``spec`` or the path it records, changed since), or a plan dict (checked as a saved plan).
    ``allow_edited`` runs a saved plan whose digest no longer matches (a warning says what changed).
    A :class:`Plan` is returned as it is.
    Compiler warnings and notes go to stderr, as ``topo plan`` prints them.

    Raises :class:`~topo.errors.SpecError` (every problem, each located), :class:`~topo.errors.StalePlanError`
    or :class:`~topo.errors.UsageError` (arguments that do not apply to ``source``). Imports no torch.
    """
    from topo.compiler.saved import resolve

    if isinstance(source, Plan):
        if variables or spec or allow_edited:
            raise UsageError("this is already a loaded Plan: variables=, spec= and allow_edited= apply when it is loaded")
        return source
    if isinstance(source, dict) and (variables or spec):
        raise UsageError("variables= apply to a spec and spec= to a saved plan's path: a plan dict takes neither")
    return Plan(resolve(source, variables, spec, allow_edited=allow_edited), allow_edited=allow_edited)


def collector(source: PlanSource | Plan, *, variables: Mapping[str, str] | None = None, spec: str | None = None,
              allow_edited: bool = False, policy_factory: str | Callable | None = None, policy: Any = None,
              report_dir: str | None = None, progress: bool = True, progress_while_collecting: bool = False,
              startup_timeout: float | None = None, max_concurrent_starts: int | None = None,
              process_logs: bool = False, command: dict | None = None, evaluation: bool = True, logger: Any = None,
              resume: Any = None, **collector_kwargs: Any) -> Run:
    """A supervised run of ``source`` for a training loop to iterate (a :class:`~topo.launch.run.Run`); imports torch.

    ``source``: a :class:`Plan` (from :func:`load`), a spec, a saved plan's path, or a plan dict (each checked);
    ``variables`` render a Jinja2 spec, ``spec`` is the spec a saved plan came from (refused if it changed since),
    ``allow_edited`` runs a plan whose digest no longer matches (for a path; a :class:`Plan` was loaded with them).
    The other keywords are the run's :class:`~topo.launch.options.Options` (``policy_factory``, ``policy``,
    ``report_dir``, ``progress``, ``startup_timeout``, ...; ``resume``: a killed run's ``run.state_dict()``, that
    saved as JSON, or its run directory: this run continues it, docs/guides/training.md#resume); any further keyword goes to the torchrl collector
    (``replay_buffer``, ``env_device``, ...). ``with topo.collector(plan, policy=plan.make_policy()) as run:``
    starts it; ``run.collector`` is the torchrl collector, ``run.update_weights()`` pushes the trainer's weights,
    ``run.report`` is the report once the block ends.
    """
    from topo.compiler.saved import resolve
    from topo.launch.options import Options
    from topo.launch.run import Run

    if isinstance(source, Plan):  # unwrapped here: the run takes the plan dict, checked again
        given = sorted(key for key, value in (("variables", variables), ("spec", spec)) if value)
        if given:
            raise UsageError(f"{', '.join(given)}= apply when a plan is loaded: pass them to topo.load")
        allow_edited = allow_edited or source.allow_edited
        source = source.data
    options = Options(policy_factory, policy, report_dir, progress, progress_while_collecting, startup_timeout,
                      max_concurrent_starts, process_logs, command, evaluation, logger, resume, collector_kwargs)
    return Run(resolve(source, variables, spec, allow_edited=allow_edited), options)


def eval_table(result: dict[str, Any]) -> str:
    """An evaluation's result (``run.evaluate()``, ``run.evaluations``) as a person reads it: the headline
    (successes, rate, 95 % interval, the weights version) and one line per task, held-out ones marked."""
    from topo.launch.evaluation.results import table

    return table(result)
