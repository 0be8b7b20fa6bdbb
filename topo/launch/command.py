"""``topo launch SPEC|PLAN``: run the topology under the startup supervisor.

Exit codes: 0 ok, 1 launch failure, 2 user error (bad spec, stale plan), 130 Ctrl-C, 143 SIGTERM.
Importing this module imports neither torch nor torchrl (the collector process does).
"""
from __future__ import annotations

import os
import shutil
import signal
import sys

import click


@click.command("launch")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("--batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Collect this many batches, then shut down.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Write DIR/summary.json and keep the run directory (markers, collector log) in DIR.")
@click.option("--quiet", is_flag=True, help="No progress and no summary; errors only.")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds; overrides the plan.")
@click.option("--max-concurrent-starts", type=click.IntRange(min=1),
              help="At most K envs constructing at once; overrides the plan.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable of a spec.")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False),
              help="The spec a saved plan came from (refuse the plan if it changed).")
@click.option("--allow-edited-plan", is_flag=True,
              help="Run a saved plan changed after topo wrote it (its digest no longer matches, or it has none).")
def launch(source, batches, report_dir, quiet, startup_timeout, max_concurrent_starts, assignments, spec_path,
           allow_edited_plan):
    """Launch SOURCE (a spec, or a plan written by `topo plan -o`) and collect a few batches."""
    from ..errors import Interrupted, TopoError

    try:
        plan = _resolve(source, assignments, spec_path, quiet, allow_edited_plan)
        _run(plan, batches, report_dir, quiet, startup_timeout, max_concurrent_starts)
    except TopoError as err:
        click.echo(err.format(), err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # before or after supervision (during it, signals are caught)
        err = Interrupted(signal.SIGINT)
        click.echo(err.format(), err=True)
        sys.exit(err.exit_code)


def _resolve(source: str, assignments: tuple[str, ...], spec_path: str | None, quiet: bool,
             allow_edited: bool = False) -> dict:
    from .. import render
    from .plans import check_fresh, read_plan

    notes: list = []
    plan = read_plan(source, allow_edited=allow_edited, warnings=notes)
    if notes and not quiet:
        click.echo(render.diagnostics_text(notes), nl=False, err=True)
    if plan is None:
        if spec_path or allow_edited:
            raise click.UsageError("--spec and --allow-edited-plan only apply when SOURCE is a saved plan")
        plan = _compile(source, assignments)
    elif assignments:
        raise click.UsageError("--set only applies to a spec: a plan is already rendered")
    elif check_fresh(plan, spec_path) is None and not quiet:
        click.echo(f"note: spec {(plan.get('spec') or {}).get('path')!r} not found: the plan was not checked against it"
                   " (pass --spec)", err=True)
    if (plan.get("placement") or {}).get("engine", "local") == "ray":
        from .ray_collector import check_reachable

        check_reachable(plan["placement"])
    return plan


def _compile(spec: str, assignments: tuple[str, ...]) -> dict:
    """The spec's plan, as ``topo plan`` compiles it (warnings printed, errors raised)."""
    from .. import load, render, validate
    from ..errors import SpecError
    from ..load import parse_assignments
    from ..plan import compile_checked

    source = load(spec, parse_assignments(assignments))
    checked = validate(source)
    if checked.errors:
        raise SpecError(checked.diagnostics)
    if checked.warnings:
        click.echo(render.diagnostics_text(checked.warnings), nl=False, err=True)
    return compile_checked(source, checked)


def _run(plan, batches, report_dir, quiet, startup_timeout, max_concurrent_starts) -> None:
    from . import report
    from .supervisor import Options, launch as run_launch

    options = Options(batches=batches, startup_timeout=startup_timeout, max_concurrent_starts=max_concurrent_starts,
                      progress=not quiet, report_dir=report_dir,
                      command={"argv": list(sys.argv), "cwd": os.getcwd()})
    outcome = run_launch(plan, options)
    summary = report.summary(outcome)
    if report_dir:
        report.write(summary, report_dir)
    if not quiet:
        click.echo(report.human(summary))
    if outcome.error is not None:
        if not report_dir:
            click.echo(f"run directory kept: {outcome.state.run.path}", err=True)
        raise outcome.error
    if not report_dir:
        shutil.rmtree(outcome.state.run.path, ignore_errors=True)
