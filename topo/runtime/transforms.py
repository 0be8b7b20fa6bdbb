"""``env.transforms`` at run time: the plan's list of transforms as a torchrl ``Compose``, built only in the
processes that build envs (an env worker, or a subcollector over its ``ParallelEnv``), never in the compiler.
torchrl is reached by name (:func:`~topo.runtime.builder.import_builder`), as a builder is: this module imports no torch.

An item is ``{"name": ..., "kwargs": {...}}`` (docs: the plan format): ``"A"`` is ``torchrl.envs.transforms.A``,
``"A.ctor"`` its named constructor (``MultiAction.from_vla``), ``"pkg.mod:fn"`` a callable returning a transform.
"""
from __future__ import annotations

from typing import Any, Callable

from topo.runtime.builder import import_builder

TORCHRL = "torchrl.envs.transforms"  # where a bare name (``StepCounter``, ``MultiAction.from_vla``) is found


def resolve(name: str) -> Callable[..., Any]:
    """The class, named constructor or ``module:callable`` an item names."""
    return import_builder(name if ":" in name else f"{TORCHRL}:{name}")


def build_stack(items: list[dict[str, Any]]):
    """``Compose`` of the items, first applied first (torchrl's order). An item that raises is named in the error
    (its place and name), the original exception chained."""
    built = []
    for i, item in enumerate(items):
        try:
            built.append(resolve(item["name"])(**(item.get("kwargs") or {})))
        except Exception as exc:
            raise TransformError(f"env.transforms[{i}] {item['name']}: {type(exc).__name__}: {exc}") from exc
    return import_builder(f"{TORCHRL}:Compose")(*built)


def wrap(env, items: list[dict[str, Any]]):
    """``TransformedEnv(env, build_stack(items))``; a stack that does not fit the env (its specs) is named too."""
    stack = build_stack(items)
    try:
        return import_builder(f"{TORCHRL}:TransformedEnv")(env, stack)
    except Exception as exc:
        names = ", ".join(item["name"] for item in items)
        raise TransformError(f"env.transforms [{names}] over {type(env).__name__}: {type(exc).__name__}: {exc}") from exc


def count_steps(env, on_step: Callable[[], None]) -> None:
    """Call ``on_step`` after every ``_step`` of ``env`` (an instance attribute, as :mod:`topo.runtime.heartbeat`
    wraps it): under ``MultiAction`` the base env's steps, each env step of a chunk, however the chunk ended."""
    step = env._step

    def counted(tensordict):
        out = step(tensordict)
        on_step()
        return out

    env._step = counted


class TransformError(RuntimeError):
    """A transform of the plan's stack could not be built, or wrapped over its env."""
