"""``gym``: a gymnasium id through torchrl's GymEnv (e.g. HalfCheetah-v5)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from topo.diagnostics import Diagnostic, error
from topo.backends.base import Assignment, Backend


class GymBackend(Backend):
    name = "gym"
    builder = "topo.envs.gym:build"
    schema_keys = frozenset({"env_name", "from_pixels", "pixels_only", "frame_skip", "categorical_action_encoding"})
    imports = ("gymnasium",)
    distributions = ("gymnasium", "mujoco")
    install_hint = 'pip install "topo[gym]"'

    def uses_gl(self, env_kwargs: Mapping[str, Any]) -> bool:
        return bool(env_kwargs.get("from_pixels"))

    def check(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        name = env_kwargs.get("env_name")
        if not isinstance(name, str) or not name:
            return [error("gym-env-name", "the gym backend needs env.kwargs.env_name, a gymnasium id",
                          tuple(path), "e.g. env_name: HalfCheetah-v5")]
        return []

    def env_kwargs(self, shared: Mapping[str, Any], a: Assignment) -> dict[str, Any]:
        return {**shared, **a.kwargs}
