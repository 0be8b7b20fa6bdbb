"""``topo eval verify CERT``: a certificate's episodes run again here, each compared field by field.

The spec is compiled again from the path the certificate names (its sha256 must match: a certificate of
another spec is refused, exit 2), each checkpoint read from its path (its sha256 must match), the episodes
drawn (all, or ``--sample N`` at random), the plan's eval rows narrowed to them (each keeps its planned task,
init state and seed: :func:`topo.launch.evaluation.certificate.narrowed`), one round per checkpoint. An episode
is ``identical`` when its outcome, length, observation checksum and applied init state are the certificate's.
"""
from __future__ import annotations

import random
from typing import Callable

import click

from topo.errors import RecordError
from topo.launch.evaluation import certificate


def verify(path: str, sample: int | None, seed: int | None, *, quiet: bool, startup_timeout: float | None,
           evaluate: Callable) -> bool:
    """Whether every episode drawn from the certificate at ``path`` ran identically here (printed per episode)."""
    cert = certificate.read(path)
    plan = _plan(path, cert, quiet)
    checkpoints = []
    for run in cert["runs"]:
        weights = run["weights"]
        if weights is not None:
            try:
                found = certificate.sha256_file(weights["path"])
            except OSError as err:
                raise RecordError(path, f"its checkpoint {weights['path']} cannot be read ({err.strerror})",
                                  hint="run verify where the checkpoint is, at the path the certificate names") from None
            if found != weights["sha256"]:
                raise RecordError(path, f"its checkpoint {weights['path']} is not the one it certifies (sha256 "
                                  f"{found[:12]} != {weights['sha256'][:12]})")
        checkpoints.append(None if weights is None else weights["path"])
    if sample is not None and seed is None:
        seed = random.SystemRandom().randrange(1 << 31)
    numbers = certificate.sample(cert, sample, seed or 0)
    click.echo(f"verify {path}: {len(numbers)} of {len(cert['runs'][0]['episodes'])} episode(s)"
               + (f" drawn with --seed {seed}" if sample is not None else "") + f", {len(checkpoints)} checkpoint(s)")
    rounds = evaluate(certificate.narrowed(plan, set(numbers)), checkpoints, quiet=quiet,
                      startup_timeout=startup_timeout)
    same = True
    for run, (result, _) in zip(cert["runs"], rounds):
        got = {e["episode"]: e for e in result["episodes_detail"] if e.get("ended")}
        name = "the factory's weights" if run["weights"] is None else run["weights"]["path"]
        for expected in (e for e in run["episodes"] if e["episode"] in numbers):
            difference = certificate.first_difference(expected, got.get(expected["episode"]))
            same &= difference is None
            click.echo(f"  {name}: episode {expected['episode']} (task {expected['task_id']}, init state "
                       f"{expected['init_state_id']}, seed {expected['seed']}): "
                       + ("identical" if difference is None else f"DIFFERS in {difference}"))
    click.echo("verified: every episode identical" if same else "NOT verified: an episode differs (above)")
    return same


def _plan(path: str, cert: dict, quiet: bool) -> dict:
    """The spec the certificate names, compiled again here; refused when it is not the certified one."""
    from topo.compiler import saved as plans
    from topo.compiler.load import load

    spec = cert["spec"]
    try:
        found = load(spec["path"], spec.get("variables") or {}).sha256
    except (OSError, ValueError, UnicodeDecodeError) as err:
        raise RecordError(path, f"its spec {spec['path']} cannot be read ({err})",
                          hint="run verify from the folder the evaluation ran in") from None
    if found != spec["sha256"]:
        raise RecordError(path, f"a certificate of another spec: {spec['path']} here has sha256 {found[:12]}, the "
                          f"certificate's {spec['sha256'][:12]}", hint="verify with the spec the evaluation ran")
    plan = plans.resolve(spec["path"], spec.get("variables") or {}, quiet=quiet, eval_override=spec.get("eval"))
    if certificate.digest(plan)["sha256"] != cert["plan"]["sha256"] and not quiet:
        click.echo("note: the plan compiled here differs from the certified one (another topo version?); the "
                   "episodes are compared by their planned task, init state and seed", err=True)
    return plan
