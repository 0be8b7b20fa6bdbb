"""Backends by name: ``libero``, ``gym``, ``toy``, a plug-in, or a user factory ``package.module:callable``.

A plug-in is a :class:`Backend` subclass that a package registers under the ``topo.backends`` entry point
group, by the name specs use::

    [project.entry-points."topo.backends"]
    pendulum = "topo_pendulum:PendulumBackend"

Entry points are read from the installed distributions' metadata; a plug-in's module is imported only
when a spec names it. A built-in name wins over a plug-in of the same name.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import re

from topo.backends.base import Assignment, Backend, BatchKeys, Layout, TaskCatalog

GROUP = "topo.backends"
_BUILTIN = {
    "libero": "topo.backends.libero:LiberoBackend",
    "gym": "topo.backends.gym:GymBackend",
    "toy": "topo.backends.toy:ToyBackend",
}
FACTORY_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")

__all__ = ["Assignment", "Backend", "BatchKeys", "Layout", "PluginError", "TaskCatalog", "available", "get_backend",
           "is_factory_path", "names"]


class PluginError(LookupError):
    """A plug-in backend registered under ``topo.backends`` that cannot be loaded."""


def available() -> dict[str, str]:
    """Every backend name with where it comes from: ``built in``, or ``plug-in <distribution> <version>``."""
    out = {name: "built in" for name in _BUILTIN}
    for ep in _entry_points():
        dist = ep.dist
        out.setdefault(ep.name, "plug-in " + (f"{dist.name} {dist.version}" if dist is not None else ep.value))
    return out


def names() -> list[str]:
    return sorted(available())


def is_factory_path(name: str) -> bool:
    return bool(FACTORY_PATH.match(name))


def get_backend(name: str) -> Backend:
    """The backend for ``env.backend``; KeyError for an unknown name, :class:`PluginError` for a broken plug-in."""
    if name in _BUILTIN:
        module, _, cls = _BUILTIN[name].partition(":")
        return getattr(importlib.import_module(module), cls)()
    for ep in _entry_points():
        if ep.name == name:
            return _load(ep)
    if is_factory_path(name):
        from topo.backends.callable import CallableBackend

        return CallableBackend(name)
    raise KeyError(name)


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=GROUP), key=lambda ep: ep.name)


def _load(ep: importlib.metadata.EntryPoint) -> Backend:
    where = f"entry point {ep.name} = {ep.value!r}" + (f" of {ep.dist.name} {ep.dist.version}" if ep.dist else "")
    try:
        cls = ep.load()
    except Exception as exc:  # a plug-in's import error is the user's to fix: say which and why
        raise PluginError(f"{where} does not load: {type(exc).__name__}: {exc}") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise PluginError(f"{where} names {cls!r}, not a topo.backends.Backend subclass")
    backend = cls()
    if backend.name != ep.name or not backend.builder:
        raise PluginError(f"{where}: its class must set name = {ep.name!r} and a builder 'module:function'")
    return backend
