"""A user factory: ``env = {"factory": "package.module:callable", "kwargs": {...}}``."""
from __future__ import annotations


def build(env: dict, **render):
    """``callable(**env["kwargs"])``; the kwargs already carry the worker's assignment (render_gpu included)."""
    from topo.runtime.builder import import_builder

    return import_builder(env["factory"])(**env.get("kwargs", {}))
