"""Rules on the eval section: tasks and init states that exist, episodes within bounds and workers that all run
some, seeds apart from training's, a policy to evaluate.

The episode count is arithmetic (:func:`topo.compiler.eval_plan.count`): it is checked against
:data:`~topo.compiler.limits.MAX_EVAL_EPISODES` before any rule lists episodes or seeds.
"""
from __future__ import annotations

from collections import Counter

from topo.compiler import eval_plan
from topo.backends.base import Backend
from topo.diagnostics import Diagnostic, error, ids_text, task_order, warning
from topo.compiler.limits import MAX_EVAL_EPISODES, count as n_text
from topo.compiler.assign import expand
from topo.compiler.spec import Spec, empty_range, parse_task_item
from topo.compiler.rules.context import Context
from topo.compiler.rules.placement import eval_beside_training
from topo.compiler.rules.render import devices
from topo.compiler.rules.seeds import SEED_LIMIT

PATH = ("eval",)


def evaluation_rules(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Every check of the eval section, all at once; those that count episodes only once the episodes are known."""
    e = spec.eval
    if e is None:
        return []
    counted = _ranges(spec) + _tasks(spec, ctx) + _init_states(spec, ctx) + _workers_shape(spec)
    out = counted + _policy(spec) + devices(spec, ctx, PATH, e.render_gpus, e.render_numbering, e.render_fallback)
    backend, catalog = ctx.backend, ctx.catalog
    # the episodes are known when their tasks and init states are: a backend that failed its checks, or no tasks
    # where the backend has them (tasks-missing), leaves them unknown
    unknown = backend is None or (catalog is None and _has_catalog(backend)) or \
        (catalog is not None and eval_plan.eval_tasks(spec, catalog) == (None,))
    if not unknown and not any(d.is_error for d in counted):
        out += _episodes(spec, ctx)
    return out


def _where(spec: Spec, key: str, items: tuple, listed: bool, pick) -> tuple:
    """The eval key, or its first item that ``pick`` chooses when it is written as a list."""
    if listed:
        for i, item in enumerate(items):
            if pick(item):
                return PATH + (key, i)
    return PATH + (key,)


def _ranges(spec: Spec) -> list[Diagnostic]:
    e = spec.eval
    out = []
    for key, items, listed, code in (("tasks", e.task_items, e.tasks_listed, "task-range-empty"),
                                     ("init_states", e.init_state_items, e.init_states_listed,
                                      "init-state-range-empty")):
        for i, item in enumerate(items):
            if (empty := empty_range(item)) is not None:
                lo, hi, fixed = empty
                out.append(error(code, f"range {item!r} of eval.{key} is empty ({lo} > {hi})",
                                 PATH + (key, i) if listed else PATH + (key,), f"write it {fixed}"))
    return out


def _tasks(spec: Spec, ctx: Context) -> list[Diagnostic]:
    e, catalog, backend = spec.eval, ctx.catalog, ctx.backend
    out = []
    path = PATH + ("tasks",)
    if e.tasks_all and catalog is None and backend is not None and not _has_catalog(backend):
        out.append(error("eval-tasks-all-unknown", f"backend {spec.backend!r} has no task catalog, so eval.tasks: all "
                         "means nothing", path, "list the eval task ids"))
    if e.tasks is not None:
        ids = expand(e.tasks, catalog)
        dup = sorted((t for t, n in Counter(ids).items() if n > 1), key=task_order)
        if dup:
            out.append(error("eval-task-duplicate", f"eval task id(s) {ids_text(dup)} listed more than once: each of "
                             f"their (task, init state) pairs would run more than trials ({e.trials}) times per "
                             "evaluation", path,
                             "list each task once; trials sets how often each (task, init state) runs"))
        if catalog is not None:
            unknown = sorted({t for t in ids if t not in catalog}, key=task_order)
            if unknown:
                where = _where(spec, "tasks", e.task_items, e.tasks_listed,
                               lambda item: any(t not in catalog for t in expand(spec.keys_of(item), catalog)))
                exists, hint = catalog.extent(unknown, spec.backend)
                out.append(error("eval-task-unknown", f"eval task id(s) {ids_text(unknown)} do not exist: {exists}",
                                 where, hint))
    return out


def _init_states(spec: Spec, ctx: Context) -> list[Diagnostic]:
    e, catalog, backend = spec.eval, ctx.catalog, ctx.backend
    if not spec.wrote("eval", "init_states") or e.init_states is None:
        return []
    path = PATH + ("init_states",)
    supported = (catalog is not None and bool(catalog.init_states)) or (backend is not None and backend.has_init_states)
    if backend is not None and not supported:
        return [error("eval-init-states-unsupported", f"backend {spec.backend!r} has no init states to choose "
                      "from: eval.init_states means nothing", path,
                      "remove eval.init_states: each eval task runs `trials` episodes")]
    out = []
    dup = sorted(i for i, n in Counter(e.init_states).items() if n > 1)
    if dup:
        out.append(error("eval-init-state-duplicate", f"init state(s) {ids_text(dup)} listed more than once: each "
                         f"eval task would run them more than trials ({e.trials}) times", path,
                         "list each init state once; trials sets how often each runs"))
    if catalog is None or not catalog.init_states:
        return out
    asked = sorted(set(e.init_states))
    by_count: dict[int, list[int]] = {}
    for task in eval_plan.eval_tasks(spec, catalog):
        n = catalog.init_states.get(task) if task is not None else None
        if n is not None and asked and asked[-1] >= n:
            by_count.setdefault(n, []).append(task)
    if by_count:
        parts = [f"task{'s' if len(tasks) > 1 else ''} {ids_text(sorted(tasks, key=task_order))} "
                 f"{'have' if len(tasks) > 1 else 'has'} {n} init states (0-{n - 1})"
                 for n, tasks in sorted(by_count.items())]
        least = min(by_count)
        where = _where(spec, "init_states", e.init_state_items, e.init_states_listed,
                       lambda item: any(i >= least for i in _ids(item)))
        out.append(error("eval-init-state-unknown", f"{'; '.join(parts)}; eval asks {ids_text(asked)}", where,
                         f"use ids below {least}, or init_states: all (every init state of each task)"))
    return out


def _workers_shape(spec: Spec) -> list[Diagnostic]:
    e = spec.eval
    if e.workers_listed and e.subcollectors is not None and len(e.workers) != e.subcollectors:
        return [error("eval-workers-list-length", f"eval workers_per_subcollector lists {len(e.workers)} "
                      f"subcollector(s) but subcollectors is {e.subcollectors}",
                      PATH + ("workers", "workers_per_subcollector"),
                      f"give {e.subcollectors} numbers, or one number for all")]
    return []


def _policy(spec: Spec) -> list[Diagnostic]:
    e, p = spec.eval, spec.policy
    out = []
    if e.policy == "server" and (p is None or p.placement != "server"):
        why = "the spec has no policy section" if p is None else f"policy.placement is {p.placement!r}"
        out.append(error("eval-policy-server", f"eval.policy: server evaluates through the training's inference "
                         f"server, but {why}", PATH + ("policy",),
                         "use eval.policy: copy (each eval subcollector builds its copy), or policy.placement: server"))
    if p is None:
        out.append(warning("eval-without-policy", "the spec has no policy section: the plan cannot say what is "
                           "evaluated; the training script's policy (or `topo eval --policy`) acts, and random "
                           "actions without one", PATH,
                           "add a policy section (factory, kwargs) so the plan names the policy it evaluates"))
    return out


def _episodes(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """What needs the episodes: their number (first, by arithmetic), idle workers, held-out tasks, seeds."""
    e, catalog = spec.eval, ctx.catalog
    total, per_task = eval_plan.count(spec, catalog)
    if total > MAX_EVAL_EPISODES:
        return [error("eval-too-large", f"{_arithmetic(spec, per_task)} = {n_text(total)} episodes per evaluation, "
                      f"more than {n_text(MAX_EVAL_EPISODES)}", _largest(spec),
                      "evaluate fewer tasks, init states or trials per evaluation (run several evaluations)")]
    out = []
    workers = sum(eval_plan.workers_of(spec, catalog, total))
    per = total // e.trials
    need = -(-workers // per)
    if workers > total:
        out.append(error("eval-workers-idle", f"{total} episode(s) ({_arithmetic(spec, per_task)}) over {workers} "
                         f"eval workers: {workers - total} would run nothing", PATH + ("workers",),
                         f"use at most {total} eval workers, or more episodes (trials: {need} gives {need * per})"))
    out += _held_out(spec, ctx)
    out += _seeds(spec, total)
    actors = len(eval_plan.workers_of(spec, catalog, total))
    short = eval_beside_training(spec, actors)
    if short:
        server = " and its own inference server's actor (placement.server)" if e.policy == "server" else ""
        out.append(error("eval-placement-unsatisfiable", f"the evaluation's {actors} actor(s) (placement.resources "
                         f"each){server} fit on no declared node beside the training's ({short}); its rounds would "
                         "wait for resources until the eval run's startup deadline", PATH,
                         "declare room for them in placement.nodes, or use fewer eval subcollectors (eval.workers)"
                         + (", or eval.policy: copy" if e.policy == "server" else "")))
    return out


def _arithmetic(spec: Spec, per_task: list) -> str:
    """How the episodes add up: ``2 tasks x 50 init states x 1 trial``, or ``50 + 25 init states x 2 trials``."""
    e = spec.eval
    tasks = [t for t, _ in per_task]
    trials = f"{n_text(e.trials)} trial{'s' if e.trials != 1 else ''}"
    if tasks == [None]:
        return trials
    counts = sorted({n for _, n in per_task})
    if len(counts) == 1:
        states = f" x {n_text(counts[0])} init state{'s' if counts[0] != 1 else ''}" if spec.eval.init_states is not None \
            or counts[0] > 1 else ""
        return f"{n_text(len(tasks))} task{'s' if len(tasks) != 1 else ''}{states} x {trials}"
    return f"{n_text(sum(n for _, n in per_task))} (task, init state) pairs over {n_text(len(tasks))} tasks x {trials}"


def _largest(spec: Spec) -> tuple:
    for key in ("trials", "init_states", "tasks"):
        if spec.wrote("eval", key):
            return PATH + (key,)
    return PATH


def _held_out(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Evaluating only training tasks measures what the policy trains on: a warning naming the held-out ones."""
    catalog = ctx.catalog
    tasks = [t for t in eval_plan.eval_tasks(spec, catalog) if t is not None]
    trained = eval_plan.training_task_ids(spec, catalog)
    if not tasks or not trained or not set(tasks) <= set(trained):
        return []
    written = spec.wrote("eval", "tasks")
    where = PATH + ("tasks",) if written else PATH
    named = ids_text(sorted(set(tasks), key=task_order))
    said = f"every eval task ({named}) is a training task" if written else \
        f"eval.tasks is left to its default, the training tasks ({named})"
    spare = [t for t in catalog.ids if t not in set(trained)] if catalog is not None else []
    if spare:
        hint = (f"evaluate held-out tasks, which training never runs: e.g. eval.tasks: {_items(spare)} "
                f"({catalog.source or spec.backend} tasks outside assignment.tasks)")
    elif catalog is not None:
        hint = (f"every task of {catalog.source or spec.backend} trains: leave some out of assignment.tasks and "
                "evaluate on them (held-out tasks)")
    else:
        hint = "evaluate held-out tasks: ids that assignment.tasks leaves out"
    return [warning("eval-on-train-tasks", f"{said}: the success rate says how the policy does on what it trains "
                    "on, not on held-out tasks", where, hint)]


def _seeds(spec: Spec, total: int) -> list[Diagnostic]:
    e = spec.eval
    if e.protocol:  # the protocol's seed, as the reference evaluation gives it, whatever training's are
        return []
    strategy, base = eval_plan.seed_stream(spec)
    path = PATH + ("seeds", "base") if spec.wrote("eval", "seeds", "base") else \
        PATH + ("seeds",) if spec.wrote("eval", "seeds") else PATH
    n = spec.total_workers
    if strategy == "offset" and base + total > SEED_LIMIT:
        how = "eval.seeds.base" if e.seed_base is not None else "the default eval base (training base + workers)"
        return [error("eval-seed-overflow", f"{how} {base} + {n_text(total)} episodes exceeds 2**63", path,
                      "use a smaller eval.seeds.base")]
    listed = spec.seed_list is not None
    if strategy == "offset" and not listed and spec.seed_strategy == "offset":
        train_lo, train_hi = spec.seed_base, spec.seed_base + n - 1
        lo, hi = max(train_lo, base), min(train_hi, base + total - 1)
        if lo > hi:
            return []
        return [error("eval-seed-overlaps-train", f"eval seeds {_span(base, base + total - 1)} ({n_text(total)} "
                      f"episodes from base {base}) overlap the training seeds {_span(train_lo, train_hi)} "
                      f"({n_text(n)} workers from base {spec.seed_base}) on {_span(lo, hi)}: {n_text(hi - lo + 1)} "
                      f"seed(s) shared, e.g. eval episode {lo - base} gets seed {lo}, training worker "
                      f"{lo - train_lo}'s", path, _fix(spec))]
    trained: dict[int, int] = {}
    for g, seed in enumerate(eval_plan.train_seeds(spec)):
        trained.setdefault(seed, g)
    shared = [(i, seed, trained[seed]) for i, seed in enumerate(eval_plan.seeds(spec, total)) if seed in trained]
    if not shared:
        return []
    shown = ", ".join(f"episode {i} (seed {seed}) = training worker {g}" for i, seed, g in shared[:3])
    more = f" and {n_text(len(shared) - 3)} more" if len(shared) > 3 else ""
    return [error("eval-seed-overlaps-train", f"{n_text(len(shared))} eval episode seed(s) equal a training "
                  f"worker's seed ({strategy} from base {base}): {shown}{more}", path, _fix(spec))]


def _fix(spec: Spec) -> str:
    """The eval base that starts after the training seeds."""
    if spec.seed_list is not None:
        after = max(spec.seed_list, default=-1) + 1
        return f"eval.seeds.base: {after} (after the largest training seed), or remove eval.seeds (topo's default)"
    if spec.seed_strategy == "sequence":
        return ("remove eval.seeds: topo's default takes the SeedSequence children after the training ones, or "
                "choose another eval.seeds.base")
    after = spec.seed_base + spec.total_workers
    return (f"eval.seeds.base: {after} (training base {spec.seed_base} + {spec.total_workers} workers: after the "
            "training seeds), or remove eval.seeds: topo's default starts there")


def _span(lo: int, hi: int) -> str:
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _ids(item) -> list[int]:
    return parse_task_item(item) if isinstance(item, (int, str)) and item != "all" else []


def _items(ids: list[int]) -> str:
    text = ids_text(ids)
    return text if "," not in text else f"[{text}]"


def _has_catalog(backend: Backend) -> bool:
    """Whether the backend has a task catalog at all (not one that failed its checks)."""
    return type(backend).catalog is not Backend.catalog
