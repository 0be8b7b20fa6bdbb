"""The ways people build a topology today, and topo's, as variants of one plan.

Each mode is the same plan with a different ``launch.construction``, start method, preload or cap:

- ``legacy``: one distinct callable per worker, torchrl's default metadata path (the parent of each
  ParallelEnv builds every env once more, serially, to read specs);
- ``homogeneous``: one factory + per-worker kwargs, default metadata (one parent env per subcollector);
- ``workers``: topo's launch, worker metadata, spawn;
- ``forkserver`` / ``forkserver-preload``: the same with forkserver env workers, the latter with the
  server preloading torch, torchrl.envs and the backend's builder module;
- ``fork``: env workers forked from their subcollector, which has torch and torchrl imported, has built
  no env and, with GL held off there (:mod:`topo.gl`), has loaded no GL library;
- ``capped``: ``workers`` with ``max_concurrent_starts``.
"""
from __future__ import annotations

import copy
import os
from typing import Any

from ..plan import preload_modules

MODES = ("legacy", "homogeneous", "workers", "forkserver", "forkserver-preload", "fork", "capped")
BASELINE = "legacy"


def variant(plan: dict[str, Any], mode: str, cap: int | None = None) -> dict[str, Any]:
    """``plan`` as ``mode`` runs it."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    out = copy.deepcopy(plan)
    launch = out["launch"]
    launch.update(construction="workers", metadata_from_workers=True, preload=None, max_concurrent_starts=None)
    out["start_methods"]["workers"] = "spawn"
    if mode == "legacy":
        launch.update(construction="legacy", metadata_from_workers=False)
    elif mode == "homogeneous":
        launch.update(construction="homogeneous", metadata_from_workers=False)
    elif mode == "forkserver":
        out["start_methods"]["workers"] = "forkserver"
    elif mode == "forkserver-preload":
        out["start_methods"]["workers"] = "forkserver"
        launch["preload"] = preload_modules(plan["env"]["builder"])
    elif mode == "fork":
        out["start_methods"]["workers"] = "fork"
    elif mode == "capped":
        launch["max_concurrent_starts"] = cap or os.cpu_count() or 2
    out["name"] = f"{plan['name']} [{mode}]"
    return out
