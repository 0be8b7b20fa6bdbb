"""``topo launch SPEC|PLAN``: run the topology in this process, as a training script would, and report;
``topo eval SPEC|PLAN``: evaluate a policy on the plan's eval rows.

``launch`` takes the same path as :func:`topo.collector`: this process is the trainer; it collects
``--batches`` batches with the plan's policy (``--policy`` or the spec's ``policy`` section; random actions
without one), then, when the plan has an eval section, evaluates once (``--no-eval``: not). ``eval`` runs
the eval rows alone (:class:`~topo.launch.evaluate.Evaluation`), like ``lerobot-eval``: a factory and,
optionally, a checkpoint (``--weights``: a file ``torch.save`` wrote, a state dict or a TensorDict, read with
``weights_only=True``: anything else is refused, never run, :mod:`topo.launch.checkpoint`).
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
              help="Write DIR/summary.json (the run that ended last) and keep the run directory (markers, logs, "
                   "its own summary.json) in DIR.")
@click.option("--quiet", is_flag=True, help="No progress and no summary; errors only.")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds; overrides the plan.")
@click.option("--max-concurrent-starts", type=click.IntRange(min=1),
              help="At most K envs constructing at once; overrides the plan.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable of a spec.")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False),
              help="The spec a saved plan came from (refuse the plan if it changed).")
@click.option("--allow-edited-plan", is_flag=True,
              help="Run a saved plan changed after topo wrote it (its digest no longer matches, or it has none).")
@click.option("--eval/--no-eval", "evaluate_too", default=True, show_default=True,
              help="Evaluate once after the batches, when the plan has an eval section.")
@click.option("--force", is_flag=True, help="Launch even when the plan's memory exceeds a node's (checked before "
              "anything starts, from a cached `topo plan --estimate` probe, else the backend's declared figure).")
@click.option("--resume", "resume_from", type=click.Path(exists=True), metavar="RUN",
              help="Continue a killed or ended run of the same plan: its run directory, its --report directory (its "
                   "latest run) or its run.state_dict() as JSON. Worker lives, episode ids, seed streams, evaluation "
                   "rounds and the policy version go on from it.")
def launch(source, batches, policy_factory, report_dir, quiet, startup_timeout, max_concurrent_starts, assignments,
           spec_path, allow_edited_plan, evaluate_too, force, resume_from):
    """Launch SOURCE (a spec, or a plan written by `topo plan -o`) and collect a few batches."""
    from topo.runtime import gl

    gl.hold()  # before torch: this process builds no env, so it opens no GL display (topo.runtime.gl)
    run = None
    try:
        from topo.compiler.load import parse_assignments
        from topo.compiler import saved as plans

        plan = plans.resolve(source, parse_assignments(assignments), spec_path, allow_edited=allow_edited_plan,
                             quiet=quiet)
        from topo.estimate.command import launch_check

        launch_check(plan, force=force, quiet=quiet)  # before any process starts
        from topo.launch.run import Run  # torch: only for a plan that runs

        run = Run(plan, policy_factory=policy_factory, report_dir=report_dir, progress=not quiet,
                  progress_while_collecting=True, startup_timeout=startup_timeout,
                  max_concurrent_starts=max_concurrent_starts, process_logs=True, evaluation=evaluate_too,
                  resume=resume_from)
        run.extra.update(batches_requested=batches, batches_collected=0)
        with run:
            for _ in run.collector:
                run.extra["batches_collected"] += 1
                if run.extra["batches_collected"] >= batches:
                    break
            if evaluate_too and plan.get("eval"):
                run.evaluate()
    finally:  # the report first; the error (topo.cli's handler) after it
        if run is not None and run.report is not None and not quiet:
            click.echo(str(run.report))


@click.command("eval")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("--policy", "policy_factory", metavar="MODULE:CALLABLE",
              help="Policy factory, called in each eval subcollector; overrides the spec's.")
@click.option("--weights", type=click.Path(exists=True, dir_okay=False),
              help="A checkpoint to evaluate (torch.save of a state dict or TensorDict); default: the factory's.")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Evaluate this many times (the same weights: a determinism check).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Write DIR/eval/round-NNN.json, DIR/eval/results.json and the run's DIR/summary.json.")
@click.option("--quiet", is_flag=True, help="No progress and no run summary; the results table only.")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds; overrides the plan.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable of a spec.")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False),
              help="The spec a saved plan came from (refuse the plan if it changed).")
@click.option("--allow-edited-plan", is_flag=True, help="Run a saved plan changed after topo wrote it.")
def evaluate(source, policy_factory, weights, rounds, report_dir, quiet, startup_timeout, assignments, spec_path,
             allow_edited_plan):
    """Evaluate a policy on SOURCE's eval rows: every (task, init state) its trials, per-task success."""
    from topo.runtime import gl

    gl.hold()
    evaluation = None
    try:
        from topo.compiler.load import parse_assignments
        from topo.compiler import saved as plans

        plan = plans.resolve(source, parse_assignments(assignments), spec_path, allow_edited=allow_edited_plan,
                             quiet=quiet)
        from topo.launch.evaluation import results as eval_results
        from topo.launch.evaluate import Evaluation

        evaluation = Evaluation(plan, policy_factory=policy_factory, out_dir=report_dir, report_dir=report_dir,
                                progress=not quiet, startup_timeout=startup_timeout, process_logs=True)
        if weights:
            evaluation.policy_weights(weights)  # read as data, and refused, before any process starts
        with evaluation:
            for _ in range(rounds):
                click.echo(eval_results.table(evaluation.evaluate()))
    finally:
        if evaluation is not None and evaluation.report is not None and not quiet:
            click.echo(str(evaluation.report))
