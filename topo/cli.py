"""The ``topo`` command line: a thin layer over the Python API. Exit codes: 0 ok, 1 launch failure,
2 bad input (spec, template, plan), 130 Ctrl-C, 143 SIGTERM."""
from __future__ import annotations

import importlib
import os
import shutil
import sys

import click

from .errors import SpecError, TopoError

LAZY_COMMANDS = {
    "launch": "topo.launch.command:launch",
    "doctor": "topo.doctor:doctor",
    "bench": "topo.bench.command:bench",
    "import": "topo.importers.command:import_",
}


class Group(click.Group):
    """Loads heavy subcommands only when they run, so validate/plan stay fast and torch-free."""

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, _, attr = LAZY_COMMANDS[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


def set_option(f):
    return click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE",
                        help="Template variable for a Jinja2 spec (repeatable).")(f)


def fail(err: TopoError) -> None:
    click.echo(err.format(), err=True)
    sys.exit(err.exit_code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="topo", prog_name="topo")
def main():
    """Compile TorchRL environment topologies from a declarative spec.

    \b
    topo validate SPEC          check a spec: every problem at once, located
    topo plan SPEC --dry-run    the per-worker assignment and its coverage
    topo plan SPEC -o plan.json save the plan that launch will run
    topo launch SPEC|PLAN       run it: nested collectors, worker metadata, report
    topo doctor SPEC            can this host run it (GL, assets, devices, memory)?
    topo bench SPEC             startup of each way to build it, against the limit
    topo import vla-grpo CFG    a spec from torchrl's vla_grpo recipe config
    """


@main.command()
@click.argument("spec", type=click.Path(dir_okay=True, path_type=str))
@set_option
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 2).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def validate(spec, assignments, strict, fmt):
    """Check SPEC against the schema and the topology rules.

    Reports every problem at once with file:line:column, key path, the arithmetic behind it and a
    hint. Exit 0 when valid, 2 when not (warnings fail only with --strict).
    """
    from . import load, render
    from . import validate as check

    try:
        from .load import parse_assignments

        source = load(spec, parse_assignments(assignments))
        diagnostics = check(source).diagnostics
    except SpecError as err:
        diagnostics = err.diagnostics
    failed = any(d.is_error for d in diagnostics) or (strict and bool(diagnostics))
    if fmt == "json":
        click.echo(render.diagnostics_json(diagnostics, not failed), nl=False)
    else:
        click.echo(render.diagnostics_text(diagnostics), nl=False, err=failed)
        if not failed:
            click.echo(f"{spec}: valid")
    sys.exit(2 if failed else 0)


@main.command()
@click.argument("spec", type=click.Path(dir_okay=True, path_type=str))
@set_option
@click.option("--dry-run", is_flag=True, help="Print the assignment; start nothing (plan never starts anything).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most N rows per subcollector in the table.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Save the plan as JSON: what `topo launch` will run, exactly.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 2).")
def plan(spec, assignments, dry_run, fmt, limit, out, strict):
    """Compile SPEC into a plan: one row per worker with its exact kwargs, and a coverage summary."""
    from . import load, render, validate
    from .load import parse_assignments
    from .plan import compile_checked, dumps

    try:
        source = load(spec, parse_assignments(assignments))
        checked = validate(source)
        if checked.errors or (strict and checked.warnings):
            raise SpecError(checked.diagnostics)  # printed once, warnings included
        if checked.warnings:
            click.echo(render.diagnostics_text(checked.warnings), nl=False, err=True)
        result = compile_checked(source, checked)
    except TopoError as err:
        fail(err)
    if out:
        try:
            with open(out, "w", encoding="utf-8") as handle:
                handle.write(dumps(result))
        except OSError as exc:
            click.echo(f"error: cannot write the plan to {out}: {exc.strerror}", err=True)
            sys.exit(2)
        click.echo(f"plan saved to {out} ({result['coverage']['workers']} workers)", err=True)
    if dry_run or not out:
        width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 120))
        click.echo(render.plan_text(result, fmt, limit, width), nl=False)


if __name__ == "__main__":
    main()
