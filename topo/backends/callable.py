"""A user factory ``package.module:callable``: called in the env worker with the shared kwargs and the
worker's assignment (task_id, instruction, group_id_offset, group_repeats, group_id_mode,
init_state_mode, init_state_id, seed, render_gpu). Accept ``**kwargs`` to ignore what you do not use.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Mapping, Sequence

from topo.diagnostics import Diagnostic, error
from topo.backends.base import Assignment, Backend

ASSIGNMENT_KEYS = ("task_id", "instruction", "group_id_offset", "group_repeats", "group_id_mode",
                   "init_state_mode", "init_state_id", "seed", "render_gpu")


class CallableBackend(Backend):
    builder = "topo.envs.user:build"
    reserved = frozenset(ASSIGNMENT_KEYS)
    install_hint = "put the factory's module on PYTHONPATH, or install its package"

    def __init__(self, path: str):
        self.name = path
        self.module, _, self.attr = path.partition(":")

    def check(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        try:
            found = importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return [error("backend-factory-not-found", f"module {self.module!r} of factory {self.name!r} is not importable",
                          ("env", "backend"), "put its folder on PYTHONPATH, or install its package")]
        return []

    def env_kwargs(self, shared: Mapping[str, Any], a: Assignment) -> dict[str, Any]:
        kwargs = {**shared, **a.kwargs}
        kwargs.update({key: getattr(a, key) for key in ASSIGNMENT_KEYS})
        return {"factory": self.name, "kwargs": kwargs}
