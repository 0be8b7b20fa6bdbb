"""Two guarded patches of robosuite's ``MjSim``, live only inside :func:`scope`.

topo's LIBERO env (:mod:`topo.envs.libero_env`) opens a scope around its construction and each reset;
outside one, both patched methods run robosuite's own code unchanged, so nothing else in the process
(another env, a test) sees a difference. :func:`install` applies them, once, in the env worker.

- ``MjSim.from_xml_string`` (called by robosuite's ``MujocoEnv._initialize_sim`` at construction and
  at every hard reset): with a :class:`~topo.envs.mujoco_cache.ModelCache` in the scope, the model
  comes from the cache. A model loaded from the cache also answers ``sim.model.get_xml()`` as a
  compiled one does (MuJoCo saves the XML it last parsed, updated from the model): the XML is parsed
  again first, on demand, since this process never parsed it.
- ``MjSim.render`` (robosuite's camera sensors): while the scope's ``unread()`` says so, a black frame
  of the same shape and dtype is returned instead of a render (rgb, and depth when asked; segmentation
  renders are always made). Rendering reads the simulation, never writes it.
"""
from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np


class Warmed(Exception):
    """Raised by the compile hook of a ``warm_only`` scope once the model is in the cache."""


@dataclass
class Scope:
    """What the patched methods do inside one :func:`scope`."""

    cache: Any = None  # a ModelCache, or None: compile as robosuite does
    label: str = ""  # what the cache entry holds, e.g. "libero_spatial task 0"
    unread: Callable[[], bool] | None = None  # True while a render would not be read
    warm_only: bool = False  # put the model in the cache, then raise Warmed (no sim, no GL)
    cache_events: list[dict] = field(default_factory=list)
    made: collections.Counter = field(default_factory=collections.Counter)  # renders made, by camera
    skipped: collections.Counter = field(default_factory=collections.Counter)  # black frames returned, by camera


_SCOPE: contextvars.ContextVar[Scope | None] = contextvars.ContextVar("topo_robosuite_scope", default=None)
_ORIGINAL: dict[str, Any] = {}


@contextlib.contextmanager
def scope(state: Scope) -> Iterator[Scope]:
    token = _SCOPE.set(state)
    try:
        yield state
    finally:
        _SCOPE.reset(token)


def install() -> None:
    """Patch robosuite's ``MjSim`` (idempotent)."""
    from robosuite.utils.binding_utils import MjSim

    if _ORIGINAL:
        return
    _ORIGINAL["from_xml_string"] = MjSim.__dict__["from_xml_string"].__func__
    _ORIGINAL["render"] = MjSim.render
    _ORIGINAL["render_signature"] = inspect.signature(MjSim.render)
    MjSim.from_xml_string = classmethod(_from_xml_string)
    MjSim.render = _render


def _from_xml_string(cls, xml):
    state = _SCOPE.get()
    if state is None or state.cache is None:
        return _ORIGINAL["from_xml_string"](cls, xml)
    if state.warm_only:
        state.cache_events.append(state.cache.ensure(xml, state.label))
        raise Warmed(state.label)
    model, event = state.cache.model(xml, state.label)
    state.cache_events.append(event)
    sim = cls(model)
    if event["result"] == "hit":
        sim.model.get_xml = functools.partial(_reparsed_xml, sim.model, xml)
    return sim


def _reparsed_xml(model, xml: str) -> str:
    """robosuite's ``get_xml`` for a model this process loaded, not parsed: parse its XML first."""
    import mujoco

    mujoco.MjModel.from_xml_string(xml)
    return type(model).get_xml(model)


def _render(self, *args, **kwargs):
    state = _SCOPE.get()
    if state is not None and state.unread is not None:
        call = _ORIGINAL["render_signature"].bind(self, *args, **kwargs)
        call.apply_defaults()
        given = call.arguments
        width, height, camera = given["width"], given["height"], given["camera_name"]
        if width and height and not given["segmentation"] and state.unread():
            state.skipped[camera] += 1
            rgb = np.zeros((height, width, 3), dtype=np.uint8)
            return (rgb, np.zeros((height, width), dtype=np.float32)) if given["depth"] else rgb
        state.made[camera] += 1
    return _ORIGINAL["render"](self, *args, **kwargs)
