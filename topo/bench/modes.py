"""The ways people build a topology today, and topo's, as variants of one plan.

Each mode is the same plan with a different ``launch.construction``, start method, preload or cap (and, for
``recipe``, builder):

- ``recipe``: what torchrl's vla_grpo recipe runs today: ``legacy``'s construction over the env family's plain
  env, the builder's options all off (:data:`RECIPE_BUILDERS`: for LIBERO torchrl's ``LiberoEnv`` itself,
  :func:`topo.envs.libero.build_recipe`, with only the fix-ups the installed LIBERO needs). For a backend
  without a recipe builder (toy, gym, plug-ins) it is ``legacy`` with the backend's builder. The bench's
  baseline: every ratio is to it, so topo's headline ratio (recipe vs topo's default) comes from one run;
- ``legacy``: one distinct callable per worker, torchrl's default metadata path (the parent of each
  ParallelEnv builds every env once more, serially, to read specs);
- ``homogeneous``: one factory + per-worker kwargs, default metadata (one parent env per subcollector);
- ``workers``: topo's launch, worker metadata, spawn;
- ``forkserver``: the same with forkserver env workers, a server of each subcollector's own;
- ``forkserver-preload`` (topo's default): one forkserver for the run, preloading torch, torchrl.envs, the
  backend's builder module and a subcollector's modules; every subcollector and env worker is forked from it
  (:mod:`topo.launch.forkserver`);
- ``fork``: env workers forked from their subcollector, which has torch and torchrl imported, has built
  no env and, with GL held off there (:mod:`topo.runtime.gl`), has loaded no GL library;
- ``capped``: ``workers`` with ``max_concurrent_starts``.

Subcollectors are spawned in every mode but ``forkserver-preload``, as torchrl's collectors start them.

Every variant acts with random actions (a spec's ``policy`` is dropped: bench measures env startup, and a
policy would cost every mode alike); :func:`with_model_cache` points a plan's model cache at the bench's own
directory, which the bench empties for cold-cache runs.
"""
from __future__ import annotations

import copy
import os
from typing import Any

from topo.compiler.plan import preload_modules

MODES = ("recipe", "legacy", "homogeneous", "workers", "forkserver", "forkserver-preload", "fork", "capped")
#: what every ratio is to: the first of these in a run (``recipe`` unless ``--modes`` leaves it out)
BASELINES = ("recipe", "legacy")
BASELINE = BASELINES[0]
DEFAULT = "forkserver-preload"  # what a spec gets unless it says otherwise (topology.start_method)
#: backend -> the builder of its plain env, as torchrl's recipes build it (``recipe`` mode)
RECIPE_BUILDERS = {"libero": "topo.envs.libero:build_recipe"}


def baseline(labels) -> str | None:
    """The mode every ratio of a run is to: ``recipe`` if it ran, else ``legacy``, else none."""
    return next((b for b in BASELINES if b in labels), None)


def variant(plan: dict[str, Any], mode: str, cap: int | None = None) -> dict[str, Any]:
    """``plan`` as ``mode`` runs it."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
    out = copy.deepcopy(plan)
    launch = out["launch"]
    launch.update(construction="workers", metadata_from_workers=True, preload=None, max_concurrent_starts=None)
    out["start_methods"].update(subcollectors="forkserver" if mode == "forkserver-preload" else "spawn",
                                workers="spawn")
    if mode in ("legacy", "recipe"):
        launch.update(construction="legacy", metadata_from_workers=False)
        if mode == "recipe" and plan["env"]["backend"] in RECIPE_BUILDERS:
            _plain(out, RECIPE_BUILDERS[plan["env"]["backend"]])
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
    out["policy"] = None
    out["name"] = f"{plan['name']} [{mode}]"
    return out


def _plain(plan: dict[str, Any], builder: str) -> None:
    """``plan``'s workers built by ``builder`` without the builder's options (in place)."""
    plan["env"]["builder"] = builder
    plan["env"].pop("options", None)
    for row in (row for sub in plan["subcollectors"] for row in sub["workers"]):
        row["kwargs"]["builder"] = builder
        row["kwargs"]["env"].pop("options", None)


def own_builder(plan: dict[str, Any], mode: str) -> bool:
    """Whether ``mode``'s workers use another builder than ``plan``'s (then the single-worker measurement,
    made with ``plan``'s builder, bounds nothing of it)."""
    return variant(plan, mode)["env"]["builder"] != plan["env"]["builder"]


def model_cache(plan: dict[str, Any]) -> bool:
    """Whether the plan's builder caches compiled models (``env.options.model_cache`` on)."""
    return bool((plan["env"].get("options") or {}).get("model_cache"))


def with_model_cache(plan: dict[str, Any], directory: str) -> dict[str, Any]:
    """``plan`` with its model cache, if on, in ``directory`` (every row's options, and the plan's)."""
    if not model_cache(plan):
        return plan
    out = copy.deepcopy(plan)
    for env in (out["env"], *(row["kwargs"]["env"] for sub in out["subcollectors"] for row in sub["workers"])):
        env["options"] = {**env["options"], "model_cache": os.path.abspath(directory)}
    return out
