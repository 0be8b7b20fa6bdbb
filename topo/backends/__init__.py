"""Backends by name: ``libero``, ``gym``, ``toy``, or a user factory ``package.module:callable``."""
from __future__ import annotations

import importlib
import re

from .base import Assignment, Backend, TaskCatalog

_BUILTIN = {
    "libero": "topo.backends.libero:LiberoBackend",
    "gym": "topo.backends.gym:GymBackend",
    "toy": "topo.backends.toy:ToyBackend",
}
FACTORY_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")

__all__ = ["Assignment", "Backend", "TaskCatalog", "builtin_names", "get_backend", "is_factory_path"]


def builtin_names() -> list[str]:
    return sorted(_BUILTIN)


def is_factory_path(name: str) -> bool:
    return bool(FACTORY_PATH.match(name))


def get_backend(name: str) -> Backend:
    """The backend for ``env.backend``; raises KeyError for an unknown builtin name."""
    if name in _BUILTIN:
        module, _, cls = _BUILTIN[name].partition(":")
        return getattr(importlib.import_module(module), cls)()
    if is_factory_path(name):
        from .callable import CallableBackend

        return CallableBackend(name)
    raise KeyError(name)
