"""A ``"package.module:callable"`` name (a builder, a factory, a policy) to the object it names.

Spec and plan name code by design (as Hydra's ``_target_``): importing the module runs it.
"""
from __future__ import annotations

import importlib
from typing import Any


def import_builder(path: str):
    """``"package.module:function"`` to the function."""
    module, _, name = path.partition(":")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target
