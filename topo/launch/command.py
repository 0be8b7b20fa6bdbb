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

import functools
import os
import sys

import click

from topo.compiler.protocols import PROTOCOLS as PROTOCOL_NAMES


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


class _Eval(click.Group):
    """``topo eval SPEC|PLAN``: the default command (``run``); ``topo eval verify CERT``: a certificate re-run."""

    def parse_args(self, ctx, args):
        if not args or args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("eval", cls=_Eval, add_help_option=False,
             context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
def evaluate():
    """Evaluate a policy on a plan's eval rows (`topo eval SPEC|PLAN --help`); re-run a certificate's episodes
    (`topo eval verify CERT`)."""


@evaluate.command("run")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("--policy", "policy_factory", metavar="MODULE:CALLABLE",
              help="Policy factory, called in each eval subcollector; overrides the spec's.")
@click.option("--weights", type=click.Path(exists=True, dir_okay=False),
              help="A checkpoint to evaluate (torch.save of a state dict or TensorDict); default: the factory's.")
@click.option("--against", type=click.Path(exists=True, dir_okay=False),
              help="A second checkpoint, run on the identical episodes: both rates, their difference with its "
                   "interval, the discordant pairs and the exact McNemar p.")
@click.option("--detect", type=click.FloatRange(min=0, max=1, min_open=True),
              help="With --against: the paired episodes a difference this size needs (5 % two-sided, 80 % power), "
                   "and whether this run had them.")
@click.option("--protocol", type=click.Choice(sorted(PROTOCOL_NAMES)),
              help="Evaluate by a named protocol (libero: the four standard suites, every task, all 50 init states "
                   "once each, the reference's step horizons, settle steps and seed), in place of the spec's eval "
                   "tasks; its eval workers and render devices stay the spec's.")
@click.option("--suites", metavar="A,B", help="With --protocol: only these suites (narrowed).")
@click.option("--tasks", "task_ids", metavar="IDS", help="With --protocol: only these task ids in each suite, e.g. "
              "0-1 (narrowed).")
@click.option("--init-states", metavar="IDS", help="With --protocol: only these init states, e.g. 0-4 (narrowed).")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Evaluate this many times (the same weights: a determinism check).")
@click.option("--report", "report_dir", type=click.Path(file_okay=False),
              help="Write DIR/eval/round-NNN.json, DIR/eval/results.json and the run's DIR/summary.json.")
@click.option("--certificate", "certificate_path", type=click.Path(dir_okay=False),
              help="Where the certificate goes (`topo eval verify` re-runs it) [default: DIR/certificate.json with "
                   "--report, else ./certificate.json].")
@click.option("--quiet", is_flag=True, help="No progress and no run summary; the results table only.")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds; overrides the plan.")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable of a spec.")
@click.option("--spec", "spec_path", type=click.Path(exists=True, dir_okay=False),
              help="The spec a saved plan came from (refuse the plan if it changed).")
@click.option("--allow-edited-plan", is_flag=True, help="Run a saved plan changed after topo wrote it.")
def run_eval(source, policy_factory, weights, against, detect, protocol, suites, task_ids, init_states, rounds,
             report_dir, certificate_path, quiet, startup_timeout, assignments, spec_path, allow_edited_plan):
    """Evaluate a policy on SOURCE's eval rows: every (task, init state) its trials, per-task success; with
    --against, two checkpoints on the same episodes. Writes a certificate (`topo eval verify CERT`)."""
    from topo.errors import UsageError

    if against and rounds != 1:
        raise UsageError("--against runs each checkpoint once: leave --rounds out")
    if detect is not None and not against:
        raise UsageError("--detect sizes a paired comparison: give --against B.pt too")
    from topo.compiler.load import parse_assignments
    from topo.compiler import saved as plans

    if (suites or task_ids or init_states) and not protocol:
        raise UsageError("--suites, --tasks and --init-states narrow a protocol: give --protocol too")
    override = None
    if protocol:
        override = _protocol(source, spec_path, allow_edited_plan, protocol, suites, task_ids, init_states)
    plan = plans.resolve(source, parse_assignments(assignments), spec_path, allow_edited=allow_edited_plan,
                         quiet=quiet, eval_override=override)
    path = certificate_path or os.path.join(report_dir or ".", "certificate.json")
    checkpoints = [weights] + ([against] if against else [None] * (rounds - 1))
    runs = _evaluate(plan, checkpoints, policy_factory=policy_factory, report_dir=report_dir, quiet=quiet,
                     startup_timeout=startup_timeout)
    from topo.launch.evaluation import certificate

    certificate.write(path, certificate.make(plan, [(checkpoints[0] if against else weights, runs[0][0])]
                                             + ([(against, runs[1][0])] if against else []), runs[-1][1], override))
    if against:
        from topo.launch.evaluation import paired

        comparison = paired.by_group(runs[0][0], runs[1][0], detect)
        click.echo(paired.table(comparison, weights or "the factory's weights", against))
        if report_dir:
            paired.write(os.path.join(report_dir, "eval", "comparison.json"), comparison)
    click.echo(f"certificate: {path} (re-run it: topo eval verify {path})")


def _protocol(source, spec_path, allow_edited_plan, protocol, suites, task_ids, init_states) -> dict:
    """The eval section ``--protocol`` puts in place of the spec's: the protocol, narrowed as asked, with the spec's
    eval workers and render devices."""
    from topo.compiler.planfile import read
    from topo.errors import UsageError

    if spec_path or allow_edited_plan or read(source) is not None:
        raise UsageError("--protocol plans the evaluation anew: give the spec, not a saved plan (or write "
                         "eval: {protocol: %s} in the spec and plan it)" % protocol)
    section: dict = {"protocol": protocol}
    if suites:
        section["suites"] = [name.strip() for name in suites.split(",") if name.strip()]
    for key, value in (("tasks", task_ids), ("init_states", init_states)):
        if value:
            items = [_item(part) for part in value.split(",") if part.strip()]
            section[key] = items[0] if len(items) == 1 else items
    return section


def _item(text: str):
    text = text.strip()
    return int(text) if text.isdigit() else text


def _evaluate(plan, checkpoints, *, policy_factory, report_dir, quiet, startup_timeout):
    """One round per entry of ``checkpoints`` (a path, or None: the weights before), on one eval run; each
    checkpoint read and fitted to the policy before any process starts. Returns (result, report) per round."""
    from topo.runtime import gl

    gl.hold()
    import copy

    from topo.estimate.command import launch_check
    from topo.launch import checkpoint
    from topo.launch.evaluation import results as eval_results
    from topo.launch.evaluate import Evaluation, run_plan

    if plan.get("eval"):
        launch_check(run_plan(plan), quiet=quiet)  # the eval workers' memory, before any process starts
        if plan["eval"].get("protocol"):
            from topo.estimate.command import eval_duration

            click.echo(eval_duration(run_plan(plan)), err=True)
    evaluation = Evaluation(plan, policy_factory=policy_factory, out_dir=report_dir, report_dir=report_dir,
                            progress=not quiet, startup_timeout=startup_timeout, process_logs=True)
    out = []
    try:
        for path in checkpoints:  # read as data, and refused, before any process starts
            if path:
                checkpoint.into(copy.deepcopy(evaluation.policy), path)
        with evaluation:
            for path in checkpoints:
                if path:
                    evaluation.policy_weights(path)
                result = evaluation.evaluate()
                click.echo(eval_results.table(result))
                out.append(result)
    finally:
        if evaluation.report is not None and not quiet:
            click.echo(str(evaluation.report))
    report = evaluation.report.data if evaluation.report is not None else None
    return [(result, report) for result in out]


@evaluate.command("verify")
@click.argument("cert", type=click.Path(exists=True, dir_okay=False))
@click.option("--sample", type=click.IntRange(min=1), default=None,
              help="Re-run N episodes drawn at random from the certificate [default: all].")
@click.option("--seed", type=int, default=None, help="The draw's seed [default: a new one, printed].")
@click.option("--quiet", is_flag=True, help="No progress and no run summary.")
@click.option("--startup-timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds; overrides the plan.")
def verify(cert, sample, seed, quiet, startup_timeout):
    """Run episodes of the certificate CERT again here, from the spec and checkpoints it names: per episode,
    identical or the first field that differs; exit 1 on a difference."""
    from topo.launch.evaluation import verify as verifying

    if not verifying.verify(cert, sample, seed, quiet=quiet, startup_timeout=startup_timeout,
                            evaluate=functools.partial(_evaluate, policy_factory=None, report_dir=None)):
        sys.exit(1)
