"""``topo bench SPEC``: one topology, launched in every mode, rounds alternating (A B C ... A B C ...).

Writes DIR/comparison.json, DIR/startup.png, and each run's summary.json and command under
DIR/runs/rRR-MODE/; with ``--sweep``, DIR/sweep.json and DIR/sweep.png instead. Imports neither torch
nor torchrl (each run is a ``topo launch`` subprocess).
"""
from __future__ import annotations

import json
import os
import sys

import click

from topo.bench.modes import DEFAULT, MODES

CACHES = {"warm": (False,), "cold": (True,), "both": (True, False)}


@click.command("bench")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable of the spec.")
@click.option("--modes", default=None, help=f"Comma-separated modes to run [default: all: {','.join(MODES)}; "
              f"with --sweep: {DEFAULT}].")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Rounds of every mode.")
@click.option("--cap", type=click.IntRange(min=1), default=None, help="max_concurrent_starts of the 'capped' mode "
              "(default: the number of CPUs).")
@click.option("--cache", type=click.Choice(sorted(CACHES)), default="warm", show_default=True,
              help="The model cache each run starts with (a builder with one, e.g. libero): warm, cold (emptied "
                   "before the run), or both, side by side. The bench keeps its own cache, in DIR/model-cache.")
@click.option("--sweep", metavar="VAR=V1,V2,...", default=None,
              help="Launch once per value of the spec's template variable VAR (e.g. workers=1,2,4,8) and fit time to "
                   "ready = intercept + slope x workers.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/bench", show_default=True)
@click.option("--batches", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--no-single", is_flag=True, help="Skip the one-worker measurement (and the lower bounds).")
def bench(spec, assignments, modes, repeats, cap, cache, sweep, out_dir, batches, no_single):
    """Launch SPEC in each mode and compare startup: parent envs, real envs, time to ready and first batch
    against the baseline (recipe: what torchrl's vla_grpo recipe runs today), each env worker's peak memory,
    and each mode's lower bound: max(chain, work / cores) from one worker's phases measured alone
    (start + imports, paid once per importing process; construction + first reset, paid by every worker)."""
    from topo.compiler.plan import compile_spec
    from topo.compiler.load import parse_assignments
    from topo.compiler.plan import dumps
    from topo.bench import chart, compare, runs, sweep as sweeps
    from topo.bench.modes import model_cache, own_builder, variant, with_model_cache

    chosen = [m.strip() for m in (modes or (DEFAULT if sweep else ",".join(MODES))).split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        raise click.BadParameter(f"unknown mode(s) {', '.join(unknown)}; modes: {', '.join(MODES)}", param_hint="--modes")
    values: list[str | None] = [None]
    variable = None
    if sweep:
        try:
            variable, values = sweeps.parse(sweep)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--sweep") from None
    fixed = parse_assignments(assignments)
    plans = {value: compile_spec(spec, fixed if value is None else {**fixed, variable: value}) for value in values}
    first = plans[values[0]]
    cache_dir = os.path.abspath(os.path.join(out_dir, "model-cache"))
    cached = model_cache(first)
    if cache != "warm" and not cached:
        raise click.BadParameter(f"backend {first['env']['backend']!r} has no model cache on in this spec",
                                 param_hint="--cache")
    starts = CACHES[cache] if cached else (False,)
    # a mode with its own builder (recipe: torchrl's plain env) uses no model cache and has no bound
    foreign = {mode for mode in chosen if own_builder(first, mode)}
    labels = [mode + (compare.COLD if cold else "") for mode in chosen
              for cold in (starts if mode not in foreign else (False,))]
    os.makedirs(os.path.join(out_dir, "plans"), exist_ok=True)
    paths = {}  # (sweep value, mode) -> plan file; mode None: the one worker measured alone, built as topo builds it

    def save(plan, name: str) -> str:
        path = os.path.join(out_dir, "plans", f"{name}.json")
        with open(path, "w") as f:
            f.write(dumps(with_model_cache(plan, cache_dir)))
        return path

    for value, plan in plans.items():
        suffix = "" if value is None else f"-{variable}{value}"
        for mode in chosen:
            paths[value, mode] = save(variant(plan, mode, cap), mode + suffix)
        paths[value, None] = save(variant(plan, "workers", cap), "single" + suffix)
    set_args = [f"{k}={v}" for k, v in fixed.items()]
    warmed: set = set()  # sweep values whose every model is in the bench's cache

    def prepare(value, cold: bool, mode: str | None = None) -> None:
        """Empty the cache for a cold start; fill it (``topo cache warm``) for a warm one, unless it is full."""
        if not cached or mode in foreign:
            return
        if cold:
            runs.clear_cache(cache_dir)
            warmed.clear()
        elif value not in warmed:
            runs.warm_cache(spec, set_args + ([f"{variable}={value}"] if variable else []), cache_dir)
            warmed.add(value)

    runs.clear_cache(cache_dir)  # what an earlier bench left in DIR is no run's
    results, singles = [], []
    for r in range(repeats):
        if not no_single:
            for cold in starts:
                prepare(values[0], cold)
                singles.append({**runs.single(paths[values[0], None]), "cold": cold})
                click.echo(f"round {r + 1}/{repeats}: one worker alone{' (cold cache)' if cold else ''} "
                           f"{singles[-1]['wall_s']:.1f} s", err=True)
        for value in values:
            for label in labels:
                mode, cold = compare.split_mode(label)
                prepare(value, cold, mode)
                name = label.replace("/", "-") + ("" if value is None else f"-{variable}{value}")
                run = runs.launch(paths[value, mode], os.path.join(out_dir, "runs", f"r{r + 1:02d}-{name}"), batches, [])
                run.update(mode=label, round=r + 1, value=value)
                results.append(run)
                if cold and run["exit_code"] == 0:
                    warmed.add(value)  # every worker got its model: compiled, then saved
                t = (run["summary"] or {}).get("timings_s", {})
                at = "" if value is None else f" {variable}={value}"
                worker = compare.worker_memory([run])
                click.echo(f"round {r + 1}/{repeats}: {label:<24}{at} exit {run['exit_code']}, ready {t.get('all_ready')}, "
                           f"first batch {t.get('first_batch')}, peak {run['peak_rss_gb']:.1f} GB"
                           + (f" (a worker at most {worker['max']:.0f} MB)" if worker else ""), err=True)
    cores = os.cpu_count() or 1
    common = dict(spec=spec, repeats=repeats, plan_sha256=first["spec"]["sha256"], command=sys.argv,
                  policy_dropped=(first.get("policy") or {}).get("factory"),
                  runs=[{k: v for k, v in run.items() if k != "summary"} for run in results], singles=singles)
    if sweep:
        shapes = {value: compare.Shape.of(plan) for value, plan in plans.items()}
        fitted = sweeps.result(results, shapes, compare.costs_of(singles), cores, labels, cap, own_builder=foreign)
        out = {"variable": variable, "values": values, "cores": cores, "costs_s": _costs(singles), "modes": fitted, **common}
        _write(os.path.join(out_dir, "sweep.json"), out)
        chart.draw_sweep(fitted, os.path.join(out_dir, "sweep.png"),
                         f"{os.path.basename(spec)}: time to ready vs workers ({variable}={','.join(values)}), "
                         f"{repeats} round(s), {cores} cores")
        click.echo(sweeps.table(fitted, variable))
    else:
        shape = compare.Shape.of(first)
        result = compare.comparison(results, singles, shape, cores, labels, cap, model_cache=cached, own_builder=foreign)
        result.update(shape=f"{shape.subcollectors}x{shape.most_per_subcollector}", **common)
        _write(os.path.join(out_dir, "comparison.json"), result)
        chart.draw(result, os.path.join(out_dir, "startup.png"),
                   f"{first['name']}: {result['shape']} ({shape.workers} workers), {repeats} round(s), {cores} cores"
                   + (f", model cache {cache}" if cached else ""))
        click.echo(compare.table(result))
        click.echo("\nwhere startup goes (median seconds since launch):\n" + compare.phases(result))
    failed = [f"r{run['round']}-{run['mode']} (exit {run['exit_code']})" for run in results if run["exit_code"] != 0]
    if failed:
        click.echo(f"failed runs: {', '.join(failed)}; see {out_dir}/runs/*/launch.log", err=True)
        sys.exit(1)


def _costs(singles):
    from topo.bench.compare import costs_of

    costs = costs_of(singles)
    return None if costs is None else costs.as_dict()


def _write(path: str, data) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
