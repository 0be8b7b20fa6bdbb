"""A run that continues another: its state as small plain JSON, read back within bounds, checked against the plan.

A resumed run is a new run (a new run directory whose ``launch.json`` names the run it resumes) whose every
subcollector starts a new worker life after every life of the runs before it, as a restart does: the life
number in each episode id and the seed stream ``planned seed + life x workers`` (:mod:`.supervision.restarts`)
both continue, so no id repeats and each worker's seeds continue the plan's streams. Its evaluation rounds, the
eval run's lives and the policy version continue too (the ``eval.every`` schedule follows the version).

The state is :meth:`topo.launch.run.Run.state_dict` (the user keeps it beside their weights), or read from the
killed run's directory (``resume.json``, rewritten at each weight update; the lives and rounds its records name
are counted from file names too, so a restart after the last update is not reused). Either is data: JSON
within :data:`MAX_STATE_BYTES`, every field checked; nothing in it is imported or run. Torch-free.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from topo.errors import RecordError, UsageError
from topo.runtime.episodes import LIFE_BITS, find_run

FORMAT = "topo.resume/1"
FILE = "resume.json"  # in a run directory: its state as of its last weight update
MAX_STATE_BYTES = 1 << 20
_COUNTS = ("lives", "eval_lives", "eval_rounds", "policy_version", "batches")
_KEYS = {"format", "plan", "run_dir", *_COUNTS}
_NOT_COMPARED = ("spec", "digest")  # where the plan was compiled from, not what it runs
_LIFE = re.compile(r"\.r(\d+)\.(?:jsonl|steps|bin)$")
_ROUND = re.compile(r"^round-(\d+)\.json$")
HINT = ("resume= takes run.state_dict() (or the JSON it was saved as) or the killed run's directory, as topo wrote "
        "them")


@dataclass(frozen=True)
class Resumed:
    """Where a run starts: its first worker life (every subcollector), the eval run's, the evaluation rounds and
    policy version already behind it, the batches delivered before, and the run directory it continues."""

    lives: int = 0
    eval_lives: int = 0
    eval_rounds: int = 0
    policy_version: int = 0
    batches: int = 0
    run_dir: str | None = None


def fingerprint(plan: dict[str, Any]) -> dict[str, str]:
    """A short digest of each part of ``plan`` (each key of each section, each subcollector): what a resumed run's
    plan must match, part by part, so that a difference is named. Where the plan came from is not compared."""
    out = {}
    for key, value in plan.items():
        if key in _NOT_COMPARED:
            continue
        if isinstance(value, dict):
            parts = {f"{key}.{sub}": item for sub, item in value.items()} or {key: value}
        elif isinstance(value, list):
            parts = {f"{key}[{i}]": item for i, item in enumerate(value)} or {key: value}
        else:
            parts = {key: value}
        out.update({name: hashlib.sha256(json.dumps(item, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16] for name, item in parts.items()})
    return out


def state(plan: dict[str, Any], run_dir: str | None, resumed: Resumed) -> dict[str, Any]:
    """The plain-JSON state a run with ``plan`` in ``run_dir`` resumes from (``resumed``: what it has got to)."""
    return {"format": FORMAT, "plan": fingerprint(plan), "run_dir": run_dir,
            **{name: getattr(resumed, name) for name in _COUNTS}}


def write(run_dir: str, data: dict[str, Any]) -> None:
    """``run_dir/resume.json``, replaced atomically."""
    final = os.path.join(run_dir, FILE)
    with open(final + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(final + ".tmp", final)


def read(source: Any, plan: dict[str, Any]) -> Resumed | None:
    """What ``source`` (``resume=``: None, a :meth:`~topo.launch.run.Run.state_dict`, a JSON file of one, or a run
    or report directory) says a run of ``plan`` starts from. A state of another plan is a
    :class:`~topo.errors.UsageError` naming each part that differs; one that is not a state, a
    :class:`~topo.errors.RecordError` naming its file."""
    if source is None or isinstance(source, Resumed):
        return source
    if isinstance(source, dict):
        return _checked(source, plan, "run.state_dict()")
    if not isinstance(source, (str, os.PathLike)):
        raise UsageError(f"resume= takes run.state_dict(), a path to it as JSON, or a run directory; got a "
                         f"{type(source).__name__}")
    path = os.fspath(source)
    if os.path.isdir(path):
        return _of_directory(path, plan)
    return _checked(_load(path), plan, path)


def _of_directory(path: str, plan: dict[str, Any]) -> Resumed:
    """The state a run directory (or the latest run of a report directory) kept, with every life and round its
    records name counted in."""
    try:
        run_dir = find_run(path)
    except FileNotFoundError as err:
        raise UsageError(f"resume={path!r}: {err}") from None
    file = os.path.join(run_dir, FILE)
    if not os.path.isfile(file):
        raise RecordError(file, "no resume state: this run directory was written by a topo without resume, or is not "
                          "a training run's", hint=HINT)
    kept = _checked(_load(file), plan, file)
    evals = os.path.join(run_dir, "eval", "collector")
    eval_runs = [os.path.join(evals, name) for name in _names(evals) if name.startswith("topo-run-")]
    return Resumed(lives=max(kept.lives, lives(run_dir)),
                   eval_lives=max([kept.eval_lives, *(lives(d) for d in eval_runs)]),
                   eval_rounds=max([kept.eval_rounds, *(int(m[1]) for m in map(_ROUND.match, _names(
                       os.path.join(run_dir, "eval"))) if m)]),
                   policy_version=kept.policy_version, batches=kept.batches, run_dir=run_dir)


def lives(run_dir: str) -> int:
    """The first worker life after every life ``run_dir``'s records name (a training run's, or an eval run's): one
    more than the highest its beats and episode files name (0: none); file names only."""
    found = [int(m[1]) for folder in ("beats", "episodes")
             for m in map(_LIFE.search, _names(os.path.join(run_dir, folder))) if m]
    return max(found, default=-1) + 1


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _load(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except OSError as err:
        raise RecordError(path, f"cannot be read: {err.strerror}", hint=HINT) from None
    if len(data) > MAX_STATE_BYTES:
        raise RecordError(path, f"more than {MAX_STATE_BYTES:,} bytes: not a resume state", hint=HINT)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as err:
        raise RecordError(path, f"not JSON ({err})", hint=HINT) from None


def _checked(data: Any, plan: dict[str, Any], where: str) -> Resumed:
    """``data`` as a :class:`Resumed`, every field checked, and its plan compared with ``plan``."""
    def refuse(message: str) -> RecordError:
        return RecordError(where, message, hint=HINT)

    if not isinstance(data, dict):
        raise refuse(f"a {type(data).__name__}, not a resume state (a JSON object)")
    if data.get("format") != FORMAT:
        raise refuse(f"format {str(data.get('format'))[:40]!r}, not {FORMAT!r}")
    unknown = sorted(map(str, set(data) - _KEYS))
    missing = sorted(_KEYS - set(data))
    if unknown or missing:
        raise refuse("; ".join(filter(None, [unknown and f"unknown keys {', '.join(k[:40] for k in unknown[:5])}",
                                             missing and f"missing keys {', '.join(missing)}"])))
    for name in _COUNTS:
        value = data[name]
        top = (1 << LIFE_BITS) if name.endswith("lives") else (1 << 62)
        if type(value) is not int or not 0 <= value < top:
            raise refuse(f"{name} must be an integer in [0, {top}), got {str(value)[:40]}")
    if data["run_dir"] is not None and not isinstance(data["run_dir"], str):
        raise refuse("run_dir must be a path or null")
    recorded = data["plan"]
    if not (isinstance(recorded, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in recorded.items())):
        raise refuse("plan must map each part of the plan to its digest")
    differ = _differences(recorded, fingerprint(plan))
    if differ:
        raise UsageError(f"resume: this plan is not the plan of the run it resumes ({data['run_dir'] or where}): "
                         f"{differ}; resume with the plan that run had (its launch.json holds it), or start a new run")
    return Resumed(**{name: data[name] for name in _COUNTS}, run_dir=data["run_dir"])


def _differences(before: dict[str, str], now: dict[str, str]) -> str:
    """The parts that differ, named: ``seeds.base differs; eval.every is new``."""
    out = [f"{name} differs" for name in sorted(before.keys() & now.keys()) if before[name] != now[name]]
    out += [f"{name} is new" for name in sorted(now.keys() - before.keys())]
    out += [f"{name} is gone" for name in sorted(before.keys() - now.keys())]
    if len(out) > 8:
        out = [*out[:8], f"and {len(out) - 8} more"]
    return "; ".join(out)
