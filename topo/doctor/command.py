"""``topo doctor SPEC``: this host's checks (:mod:`topo.doctor.host`), or, with ``placement.engine: ray``, every node's
of the plan's cluster (:mod:`topo.doctor.cluster`). Importing it imports neither torch, ray nor a simulator."""
from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click

from topo.checks import FAIL
from topo.doctor.host import render_text, run_checks
from topo.compiler.plan import engine


@click.command()
@click.argument("spec", type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Template variable (repeatable).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--node-timeout", type=float, default=300.0, show_default=True, metavar="SECONDS",
              help="placement.engine ray: how long each node of the cluster has to run its checks.")
def doctor(spec, assignments, fmt, node_timeout):
    """Check that this host can launch SPEC (a spec or a saved plan): imports, GL, render GPUs, files, memory.

    With placement.engine ray, the checks run on every alive node of the plan's cluster instead, each node's
    memory estimated for the subcollectors the plan places there; a cluster that lets in a client without its
    token (Ray's token authentication off) is a warning.

    Exit 0 when nothing blocks a launch (warnings allowed), 1 when a check fails, 2 on a bad spec.
    """
    from topo.compiler.saved import resolve
    from topo.compiler.load import parse_assignments

    plan = resolve(spec, parse_assignments(assignments))
    if engine(plan) == "ray":
        from topo.doctor.cluster import doctor_cluster

        sys.exit(doctor_cluster(spec, plan, fmt, node_timeout))
    checks = run_checks(plan)
    failed = any(c.status == FAIL for c in checks)
    if fmt == "json":
        click.echo(json.dumps({"spec": spec, "ok": not failed, "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        click.echo(render_text(spec, plan, checks), nl=False)
    sys.exit(1 if failed else 0)
