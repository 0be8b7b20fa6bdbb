"""``topo launch SPEC|PLAN``: run the topology in this process, as a training script would, and report.

The same path as :func:`topo.collector`: this process is the trainer; it collects ``--batches`` batches
with the plan's policy (``--policy`` or the spec's ``policy`` section; random actions without one).
Exit codes: 0 ok, 1 launch failure, 2 user error (bad spec, stale plan), 130 Ctrl-C, 143 SIGTERM.
Importing this module imports neither torch nor torchrl.
"""
from __future__ import annotations

import click


@click.command("launch")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("--batches", type=click.IntRange(min=1), default=1, show_default=True,
              help="Collect this many batches, then shut down.")
@click.option("--policy", "policy_factory", metavar="MODULE:CALLABLE",
              help="Policy factory, called in each subcollector (or the server); overrides the spec's.")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Write DIR/summary.json and keep the run directory (markers, logs) in DIR.")
@click.option("--quiet", is_flag=True, help="No progress and no summary; errors only.")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds; overrides the plan.")
@click.option("--max-concurrent-starts", type=click.IntRange(min=1),
              help="At most K envs constructing at once; overrides the plan.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable of a spec.")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False),
              help="The spec a saved plan came from (refuse the plan if it changed).")
@click.option("--allow-edited-plan", is_flag=True,
              help="Run a saved plan changed after topo wrote it (its digest no longer matches, or it has none).")
def launch(source, batches, policy_factory, report_dir, quiet, startup_timeout, max_concurrent_starts, assignments,
           spec_path, allow_edited_plan):
    """Launch SOURCE (a spec, or a plan written by `topo plan -o`) and collect a few batches."""
    from .. import gl

    gl.hold()  # before torch: this process builds no env, so it opens no GL display (topo.gl)
    run = None
    try:
        from ..load import parse_assignments
        from . import plans

        plan = plans.resolve(source, parse_assignments(assignments), spec_path, allow_edited=allow_edited_plan,
                             quiet=quiet)
        from .session import Run  # torch: only for a plan that runs

        run = Run(plan, policy_factory=policy_factory, report_dir=report_dir, progress=not quiet,
                  progress_while_collecting=True, startup_timeout=startup_timeout,
                  max_concurrent_starts=max_concurrent_starts, process_logs=True)
        run.extra.update(batches_requested=batches, batches_collected=0)
        with run:
            for _ in run.collector:
                run.extra["batches_collected"] += 1
                if run.extra["batches_collected"] >= batches:
                    break
    finally:  # the report first; the error (topo.cli's handler) after it
        if run is not None and run.report is not None and not quiet:
            click.echo(str(run.report))
