"""``pendulum``: torchrl's PendulumEnv swung up on another planet per task. A third-party topo backend,
registered through the ``topo.backends`` entry point group (pyproject.toml); topo is not changed for it."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from topo.backends import Assignment, Backend, TaskCatalog
from topo.diagnostics import Diagnostic, error

PLANETS = {0: ("earth", 9.81), 1: ("moon", 1.62), 2: ("mars", 3.71)}


class PendulumBackend(Backend):
    name = "pendulum"
    builder = "topo_pendulum.build:build"
    reserved = frozenset({"g", "seed"})
    reserved_hint = "the task sets gravity: tasks 0 earth, 1 moon, 2 mars"
    memory_per_worker_gb = 0.4
    imports = ("torchrl.envs",)
    distributions = ("topo-pendulum",)
    install_hint = "pip install topo-pendulum"

    def catalog(self, env_kwargs: Mapping[str, Any]) -> TaskCatalog:
        return TaskCatalog(ids=tuple(PLANETS), language={t: f"swing up on the {p}" for t, (p, _) in PLANETS.items()},
                           source="planets")

    def check(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        return [error("pendulum-unknown-kwarg", f"PendulumEnv takes no keyword {key!r}", tuple(path) + (key,),
                      "accepted: device") for key in env_kwargs if key not in self.reserved | {"device"}]

    def env_kwargs(self, shared: Mapping[str, Any], a: Assignment) -> dict[str, Any]:
        return {**shared, **a.kwargs, "g": PLANETS[a.task_id][1] if a.task_id is not None else 10.0}
