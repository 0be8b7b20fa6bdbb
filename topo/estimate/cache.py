"""Probe results kept per (what one worker is built from, this host): reused until either changes.

The key holds the probe's request with every per-worker field dropped (a plan row's own fields, from
:class:`topo.compiler.row.Row`, and the backend's ``reserved`` kwargs: seed, task, group, instruction, init
state...), whether the worker renders on a GPU, the policy and its request size, and the host's fingerprint
(hostname, cores, MemTotal, the Python, torch, torchrl and topo versions). One JSON file per key in
``$TOPO_ESTIMATE_CACHE``, else ``$XDG_CACHE_HOME/topo/estimate`` (``~/.cache/topo/estimate``), as the model
cache chooses its own (:mod:`topo.runtime.model_cache`). Imports no torch.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any, Mapping

from topo.compiler.row import Row

CACHE_VAR = "TOPO_ESTIMATE_CACHE"
#: a row's own fields: never in the key (nor, by the same name, in its env kwargs)
PER_ROW = frozenset(Row.__required_keys__) - {"kwargs"}


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_VAR, "").strip():
        return Path(environ[CACHE_VAR]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or str(Path.home()), ".cache")
    return Path(base) / "topo" / "estimate"


def shared(row_kwargs: Mapping[str, Any], reserved: frozenset[str]) -> dict[str, Any]:
    """A row's kwargs block without what is per worker: what every worker of the plan is built from."""
    env = {k: v for k, v in row_kwargs["env"].items() if k not in PER_ROW | reserved}
    out = {k: v for k, v in row_kwargs.items() if k not in ("env", "seed", "worker", "render_gpu", "schedule")}
    return {**out, "env": env, "renders_on_gpu": row_kwargs.get("render_gpu") is not None}


def fingerprint() -> dict[str, Any]:
    """This host, as far as a probe's figures depend on it."""
    versions = {}
    for dist in ("torch", "torchrl", "topo"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "mem_total_kb": _mem_total_kb(),
            "python": platform.python_version(), **versions}


def key(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def load(fields: Mapping[str, Any], directory: Path | None = None) -> dict[str, Any] | None:
    """The cached probe result for ``fields`` (None: none, or unreadable)."""
    try:
        entry = json.loads(((directory or cache_dir()) / f"{key(fields)}.json").read_text())
    except (OSError, ValueError):
        return None
    return entry.get("result") if isinstance(entry, dict) else None


def save(fields: Mapping[str, Any], result: Mapping[str, Any], directory: Path | None = None) -> Path:
    """Write the entry atomically; returns its path."""
    where = directory or cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"{key(fields)}.json"
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"fields": fields, "result": result}, default=str, indent=1))
    os.replace(tmp, path)
    return path


def _mem_total_kb() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return None
