"""``topo bench SPEC``: one topology, launched in every mode, rounds alternating (A B C ... A B C ...).

Writes DIR/comparison.json, DIR/startup.png, and each run's summary.json and command under
DIR/runs/rRR-MODE/. Imports neither torch nor torchrl (each run is a ``topo launch`` subprocess).
"""
from __future__ import annotations

import json
import os
import sys

import click

from .modes import MODES


@click.command("bench")
@click.argument("spec", type=click.Path(exists=True, dir_okay=False))
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable of the spec.")
@click.option("--modes", default=",".join(MODES), show_default=True, help="Comma-separated modes to run.")
@click.option("--repeats", type=click.IntRange(min=1), default=3, show_default=True, help="Rounds of every mode.")
@click.option("--cap", type=click.IntRange(min=1), default=None, help="max_concurrent_starts of the 'capped' mode "
              "(default: the number of CPUs).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/bench", show_default=True)
@click.option("--batches", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--no-single", is_flag=True, help="Skip the one-worker measurement (and the lower bound).")
def bench(spec, assignments, modes, repeats, cap, out_dir, batches, no_single):
    """Launch SPEC in each mode and compare startup: parent envs, real envs, time to ready and first batch."""
    from .. import compile_spec
    from ..load import parse_assignments
    from ..plan import dumps
    from . import chart, compare, runs
    from .modes import variant

    chosen = [m.strip() for m in modes.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in MODES]
    if unknown:
        raise click.BadParameter(f"unknown mode(s) {', '.join(unknown)}; modes: {', '.join(MODES)}", param_hint="--modes")
    plan = compile_spec(spec, parse_assignments(assignments))
    os.makedirs(os.path.join(out_dir, "plans"), exist_ok=True)
    paths = {}
    for mode in chosen:
        paths[mode] = os.path.join(out_dir, "plans", f"{mode}.json")
        with open(paths[mode], "w") as f:
            f.write(dumps(variant(plan, mode, cap)))
    workers = plan["coverage"]["workers"]
    shape = "x".join([str(len(plan["subcollectors"])), str(max(s["num_workers"] for s in plan["subcollectors"]))])
    results, singles = [], []
    for r in range(repeats):
        if not no_single:
            singles.append(runs.single(paths[chosen[0]]))
            click.echo(f"round {r + 1}/{repeats}: one worker alone {singles[-1]['wall_s']:.1f} s", err=True)
        for mode in chosen:
            run = runs.launch(paths[mode], os.path.join(out_dir, "runs", f"r{r + 1:02d}-{mode}"), batches, [])
            run.update(mode=mode, round=r + 1)
            results.append(run)
            t = (run["summary"] or {}).get("timings_s", {})
            click.echo(f"round {r + 1}/{repeats}: {mode:<19} exit {run['exit_code']}, ready {t.get('all_ready')}, "
                       f"first batch {t.get('first_batch')}, peak {run['peak_rss_gb']:.1f} GB", err=True)
    result = compare.comparison(results, singles, workers, os.cpu_count() or 1, chosen)
    result.update(spec=spec, shape=shape, repeats=repeats, plan_sha256=plan["spec"]["sha256"],
                  runs=[{k: v for k, v in run.items() if k != "summary"} for run in results],
                  singles=singles, command=sys.argv)
    with open(os.path.join(out_dir, "comparison.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    chart.draw(result, os.path.join(out_dir, "startup.png"),
               f"{plan['name']}: {shape} ({workers} workers), {repeats} round(s), {os.cpu_count()} cores")
    click.echo(compare.table(result))
    click.echo("\nwhere startup goes (median seconds since launch):\n" + compare.phases(result))
    failed = [f"r{run['round']}-{run['mode']} (exit {run['exit_code']})" for run in results if run["exit_code"] != 0]
    if failed:
        click.echo(f"failed runs: {', '.join(failed)}; see {out_dir}/runs/*/launch.log", err=True)
        sys.exit(1)
