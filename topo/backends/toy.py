"""``toy``: torchrl's ToyVLAEnv, the VLA TensorDict schema without a simulator (cheap; for tests and demos)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from topo.diagnostics import Diagnostic, error
from topo.backends.base import Assignment, Backend, Layout, TaskCatalog


class ToyBackend(Backend):
    name = "toy"
    builder = "topo.envs.toy:build"
    schema_keys = frozenset({"action_dim", "state_dim", "image_shape", "from_pixels", "render_size", "success_steps"})
    reserved = frozenset({"instruction", "group_id_offset", "group_repeats", "seed", "batch_size"})
    reserved_hint = "use the assignment section (instructions, groups, seeds)"

    def check(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        out = []
        action_dim, state_dim = env_kwargs.get("action_dim", 4), env_kwargs.get("state_dim", 6)
        if env_kwargs.get("success_steps") is not None and isinstance(action_dim, int) and isinstance(state_dim, int) \
                and state_dim < 2 * action_dim:
            out.append(error("toy-state-dim", f"tracking mode (success_steps) needs state_dim >= 2 * action_dim: "
                             f"{state_dim} < 2 * {action_dim} = {2 * action_dim}", tuple(path) + ("state_dim",),
                             f"set state_dim: {2 * action_dim}"))
        return out

    def layout(self, env_kwargs: Mapping[str, Any]) -> Layout | None:
        """ToyVLAEnv's: ``observation.image`` uint8 ``image_shape``, ``observation.state`` float32 [state_dim],
        ``action`` float32 [action_dim] (its constructor's defaults: [3, 16, 16], 6, 4)."""
        image, state, action = (env_kwargs.get("image_shape", (3, 16, 16)), env_kwargs.get("state_dim", 6),
                                env_kwargs.get("action_dim", 4))
        if not (isinstance(image, (list, tuple)) and all(isinstance(d, int) for d in image)
                and isinstance(state, int) and isinstance(action, int)):
            return None
        return Layout({"observation.image": (tuple(image), "uint8"), "observation.state": ((state,), "float32")},
                      {"action": ((action,), "float32")})

    def default_instruction(self, task_id: int | None, catalog: TaskCatalog | None) -> str | None:
        return None if task_id is None else f"toy task {task_id}"

    def env_kwargs(self, shared: Mapping[str, Any], a: Assignment) -> dict[str, Any]:
        kwargs = {**shared, **a.kwargs, "group_id_offset": a.group_id_offset}
        if a.instruction is not None:
            kwargs["instruction"] = a.instruction
        if a.group_repeats is not None:
            kwargs["group_repeats"] = a.group_repeats
        return kwargs
