"""``topo import``: write a topo spec from another tool's config. Exit 0 written, 2 bad input (with
``--strict``, warnings too)."""
from __future__ import annotations

import os
import sys

import click


@click.group(name="import")
def import_():
    """Write a topo spec from another tool's config, each value commented with where it came from.

    \b
    topo import vla-grpo CONFIG.yaml [--set key=value ...] [-o SPEC]
    """


@import_.command(name="vla-grpo")
@click.argument("config", type=click.Path(dir_okay=True, path_type=str))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Hydra override, applied before the import: collector.num_collectors=5, '+key=value', '~key' "
                   "(repeatable).")
@click.option("-o", "--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the spec here instead of stdout.")
@click.option("--strict", is_flag=True, help="Warnings (unknown keys, settings a spec cannot carry) fail too (exit 2).")
def vla_grpo(config, overrides, out, strict):
    """A spec from torchrl's vla_grpo recipe config (sota-implementations/vla_grpo/config/vla_grpo_libero.yaml).

    Its plan is the recipe's assignment, worker for worker, and its evaluation as an eval section. Where the spec
    differs from the recipe on purpose (the eval seeds), and what a spec does not express (policy, inference
    server, replay, logging), is said on stderr and at the end of the spec; unknown keys are warned about.
    """
    from topo.errors import SpecError
    from topo.compiler.render import diagnostics_text
    from topo.importers import hydra
    from topo.importers.vla_grpo import convert

    imported = convert(hydra.read(config, overrides), os.path.basename(config))
    if strict and imported.warnings:
        raise SpecError(imported.warnings)
    if imported.warnings:
        click.echo(diagnostics_text(imported.warnings), nl=False, err=True)
    for line in imported.differs:
        click.echo(f"differs from the recipe: {line}", err=True)
    for line in imported.left_out_lines():
        click.echo(f"not expressed: {line}", err=True)
    if out:
        try:
            with open(out, "w", encoding="utf-8") as handle:
                handle.write(imported.text)
        except OSError as exc:
            click.echo(f"error: cannot write the spec to {out}: {exc.strerror}", err=True)
            sys.exit(2)
    else:
        click.echo(imported.text, nl=False)
    where = out or "stdout"
    left_out = sum(len(keys) for _, keys in imported.left_out)
    click.echo(f"spec written to {where}: {imported.written} value(s) from {config}, {imported.defaults} equal to "
               f"topo's defaults, {left_out} key(s) not expressed (listed at the end of the spec), "
               f"{len(imported.warnings)} warning(s); next: topo plan SPEC --dry-run", err=True)
