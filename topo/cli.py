"""The ``topo`` command line: a thin layer over the Python API. Exit codes: 0 ok, 1 launch failure,
2 bad input (spec, template, plan), 130 Ctrl-C, 143 SIGTERM."""
from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import sys

import click

from topo.errors import Interrupted, SpecError, TopoError, UsageError

LAZY_COMMANDS = {
    "launch": "topo.launch.command:launch",
    "eval": "topo.launch.command:evaluate",
    "doctor": "topo.doctor.command:doctor",
    "bench": "topo.bench.command:bench",
    "import": "topo.importers.command:import_",
    "runs": "topo.runs.command:runs",
    "top": "topo.runs.top:top",
    "replay": "topo.runs.command:replay",
}


class Group(click.Group):
    """Loads heavy subcommands only when they run, so validate/plan stay fast and torch-free; turns topo's
    errors into their message and exit code (2 bad input, 1 launch failure, 128 + signal), never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            fail(Interrupted(signal.SIGINT))
        except TopoError as err:
            fail(err)

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def format_epilog(self, ctx, formatter):
        """The backends a spec may name here: built in, plug-ins found (``topo.backends`` entry points)."""
        from topo.backends import available

        with formatter.section("Backends"):
            formatter.write_dl([(name, where) for name, where in sorted(available().items())]
                               + [("package.module:callable", "your own factory")])

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
    topo plan SPEC --estimate   memory, ready time, frames/s here; refuses what cannot fit
    topo launch SPEC|PLAN       run it: nested collectors, worker metadata, report
    topo eval SPEC|PLAN         evaluate a policy (a checkpoint) on the plan's eval rows, per task
    topo top [RUN]              a running topology, one line per worker (from another terminal)
    topo doctor SPEC            can this host run it (GL, assets, devices, memory)?
    topo bench SPEC             startup of each way to build it, against the limit
    topo import vla-grpo CFG    a spec from torchrl's vla_grpo recipe config
    topo cache list|size|clear  the compiled-model cache of MuJoCo workers; warm SPEC fills it
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
    from topo.compiler import render
    from topo.compiler.load import load
    from topo.compiler.validate import validate as check

    try:
        from topo.compiler.load import parse_assignments

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
@click.option("--dry-run", is_flag=True, help="Print the assignment; start nothing (plan starts nothing but "
              "--estimate's probe).")
@click.option("--format", "fmt", type=click.Choice(["table", "json", "yaml"]), default="table", show_default=True)
@click.option("--limit", type=click.IntRange(min=0), default=None, help="At most N rows per subcollector in the table.")
@click.option("-o", "--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Save the plan as JSON: what `topo launch` will run, exactly.")
@click.option("--strict", is_flag=True, help="Warnings fail too (exit 2).")
@click.option("--estimate", is_flag=True,
              help="Predict memory per node, ready time, frames/s and time per iteration on this host, from one worker "
                   "probed in a child process (it runs the spec's builder and policy factory; cached per backend "
                   "kwargs and host, in $TOPO_ESTIMATE_CACHE or ~/.cache/topo/estimate); refuse (exit 2) what does "
                   "not fit.")
@click.option("--reprobe", "--no-cache", "reprobe", is_flag=True, help="With --estimate: probe again, whatever is cached.")
@click.option("--force", is_flag=True, help="With --estimate: exit 0 even when a node's memory is exceeded.")
@click.option("--target-frames-per-s", "target", type=click.FloatRange(min=0, min_open=True), default=None,
              help="With --estimate (implied): the fewest workers per subcollector that reach N frames/s here, or why none.")
def plan(spec, assignments, dry_run, fmt, limit, out, strict, estimate, reprobe, force, target):
    """Compile SPEC into a plan: one row per worker with its exact kwargs, and a coverage summary."""
    from topo.compiler import render
    from topo.compiler.load import load
    from topo.compiler.plan import compile_source
    from topo.compiler.load import parse_assignments
    from topo.compiler.plan import write

    estimate = estimate or target is not None
    if estimate and fmt == "yaml":
        raise UsageError("--estimate prints a table or JSON (--format table|json)")
    source = load(spec, parse_assignments(assignments))
    result = compile_source(source, strict=strict,
                            on_warnings=lambda found: click.echo(render.diagnostics_text(found), nl=False, err=True))
    if out:
        try:
            write(result, out)
        except OSError as exc:
            click.echo(f"error: cannot write the plan to {out}: {exc.strerror}", err=True)
            sys.exit(2)
        click.echo(f"plan saved to {out} ({result['coverage']['workers']} workers)", err=True)
    if estimate:
        from topo.estimate.command import estimate as predict

        predict(result, "json" if fmt == "json" else "text", reprobe=reprobe, force=force, target=target, source=source)
    elif dry_run or not out:
        width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else int(os.environ.get("COLUMNS", 120))
        click.echo(render.plan_text(result, fmt, limit, width), nl=False)
    from topo.compiler.imports import describe

    click.echo(f"note: {describe(result)}", err=True)  # the code a launch of it runs, named before anything runs


def dir_option(f):
    return click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=str), default=None,
                        help="The cache directory (default: $TOPO_MODEL_CACHE, else $XDG_CACHE_HOME/topo/mujoco).")(f)


def cache_directory(directory: str | None):
    """``--dir``, else the default; exits 0 with a note when the cache is off."""
    from pathlib import Path

    from topo.runtime.model_cache import CACHE_VAR, cache_dir

    where = Path(directory).expanduser() if directory else cache_dir(True)
    if where is None:
        click.echo(f"the model cache is off ({CACHE_VAR}={os.environ.get(CACHE_VAR)}); give --dir to see one")
        sys.exit(0)
    return where


@main.group()
def cache():
    """The compiled-model cache: MuJoCo workers (LIBERO) load a task's compiled model instead of compiling
    it again (0.3 s instead of 3-4 s; ~260 MB per LIBERO task). Turn it off with env.options.model_cache:
    false in a spec, or TOPO_MODEL_CACHE=off in the environment of a launch."""


@cache.command("list")
@dir_option
def cache_list(directory):
    """Every entry: its key, size, what it holds, when it was compiled and how long that took."""
    import datetime

    from topo.runtime.model_cache import disk_bytes, entries, human_bytes

    where = cache_directory(directory)
    found = entries(where)
    for e in found:
        made = datetime.datetime.fromtimestamp(e.created).strftime("%Y-%m-%d %H:%M")
        took = f"compiled in {e.compile_s:.1f} s" if isinstance(e.compile_s, (int, float)) else ""
        click.echo(f"{e.key[:12]}  {human_bytes(e.bytes):>9}  {made}  mujoco {e.mujoco}  {e.label}  {took}".rstrip())
    click.echo(f"{len(found)} entr{'y' if len(found) == 1 else 'ies'}, {human_bytes(disk_bytes(where))} in {where}")


@cache.command("size")
@dir_option
@click.option("--bytes", "as_bytes", is_flag=True, help="Print the byte count alone.")
def cache_size(directory, as_bytes):
    """Disk space the cache takes (entries, and leftovers of interrupted writes)."""
    from topo.runtime.model_cache import disk_bytes, entries, human_bytes

    where = cache_directory(directory)
    total = disk_bytes(where)
    count = len(entries(where))
    click.echo(str(total) if as_bytes else f"{human_bytes(total)} in {count} entr{'y' if count == 1 else 'ies'} at {where}")


@cache.command("clear")
@dir_option
def cache_clear(directory):
    """Delete every cache file (only topo's: <sha256>.mjb/.json/.lock and temporary files)."""
    from topo.runtime.model_cache import clear, human_bytes

    where = cache_directory(directory)
    files, size = clear(where)
    click.echo(f"removed {files} file(s), {human_bytes(size)} from {where}")


@cache.command("warm")
@click.argument("spec", type=click.Path(dir_okay=True, path_type=str))
@set_option
@dir_option
@click.option("--first-worker", is_flag=True,
              help="Then build the plan's first worker, reset and step it once: the JIT kernels and shaders a "
                   "first launch would compile (LIBERO: robosuite's numba kernels, Mesa's shaders) are on disk.")
def cache_warm(spec, assignments, directory, first_worker):
    """Compile the models of SPEC's tasks into the cache, one per distinct task, before a launch.

    Nothing is built (but with --first-worker): each task's construction stops right after MuJoCo compiled its model. Exit 0
    when every task is cached, 1 when one failed, 2 for a bad spec. (A builder module whose models
    topo caches offers ``warm(env, directory)``, ``model_identity(env)`` and ``model_label(env)``,
    and ``warm_first_worker(env, directory)`` for --first-worker.)
    """
    from topo.compiler.plan import compile_spec
    from topo.compiler.load import parse_assignments
    from topo.runtime.model_cache import human_bytes
    from topo.compiler.plan import rows

    plan = compile_spec(spec, parse_assignments(assignments))
    module = importlib.import_module(plan["env"]["builder"].partition(":")[0])
    if not hasattr(module, "warm"):
        click.echo(f"backend {plan['env']['backend']!r} compiles no MuJoCo model that topo caches: nothing to warm")
        return
    distinct = {}
    for row in rows(plan):
        distinct.setdefault(module.model_identity(row["kwargs"]["env"]), row["kwargs"]["env"])
    failed = ready = 0
    for env in distinct.values():
        try:
            with contextlib.redirect_stdout(sys.stderr):  # what LIBERO prints stays off this command's output
                event = module.warm(env, directory)
        except Exception as exc:  # one task's failure is reported, the others still warm
            failed += 1
            click.echo(f"{module.model_label(env)}: failed: {type(exc).__name__}: {exc}", err=True)
            continue
        result, size = event["result"], human_bytes(event.get("bytes", 0))
        ready += result in ("hit", "miss", "corrupt")
        what = {"hit": f"cached already, {size}", "miss": f"compiled in {event.get('compile_s', 0):.1f} s, {size}",
                "corrupt": f"unsound entry replaced: compiled in {event.get('compile_s', 0):.1f} s, {size}",
                "disabled": "the model cache is off"}.get(result, result)
        click.echo(f"{event['label']}: {what}" + (f" ({event['key'][:12]})" if event.get("key") else ""))
    click.echo(f"{ready} of {len(distinct)} model(s) ready")
    if first_worker and not failed and hasattr(module, "warm_first_worker"):
        env = next(iter(distinct.values()))
        try:
            with contextlib.redirect_stdout(sys.stderr):
                phases = module.warm_first_worker(env, directory)
        except Exception as exc:
            click.echo(f"first worker ({module.model_label(env)}): failed: {type(exc).__name__}: {exc}", err=True)
            sys.exit(1)
        click.echo(f"first worker ({phases['label']}): built in {phases['build_s']:.1f} s, reset and stepped "
                   f"in {phases['reset_step_s']:.1f} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
