"""torchrl's transforms as data: each one's constructor and named constructors, so the compiler checks
``env.transforms`` without importing torch.

The catalogue (``topo/compiler/schemas/torchrl-transforms.json``) is generated from the installed torchrl by
``scripts/transform-catalog --write`` and held to it by a test (the script without ``--write`` compares them,
with :func:`differences`). Reading it imports nothing.

An entry (a class ``torchrl.envs.transforms`` exports): ``{"params", "constructors": {name: params}}``; a parameter: ``{"name", "kind", "required",
"default" (when JSON can hold it) or "default_text", "annotation"}`` (``kind``: positional-or-keyword,
keyword-only, var-keyword, var-positional, positional-only).
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

CATALOG_FILE = "torchrl-transforms.json"
REGENERATE = "scripts/transform-catalog --write"


@functools.lru_cache(maxsize=None)
def catalog() -> dict[str, Any]:
    """The shipped catalogue: ``{"torchrl": version, "transforms": {name: entry}}``."""
    return json.loads(resources.files("topo.compiler.schemas").joinpath(CATALOG_FILE).read_text())


def differences(shipped: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """How ``fresh`` (the installed torchrl's) differs from ``shipped``, one line each; a renamed kwarg shows as one
    parameter gone and one new."""
    out = []
    if shipped.get("torchrl") != fresh.get("torchrl"):
        out.append(f"torchrl {fresh.get('torchrl')} is installed, the catalogue is of {shipped.get('torchrl')}")
    old, new = shipped.get("transforms", {}), fresh.get("transforms", {})
    out += [f"{name}: gone from torchrl" for name in old if name not in new]
    out += [f"{name}: new in torchrl" for name in new if name not in old]
    for name in (n for n in new if n in old):
        pairs = [(name, old[name]["params"], new[name]["params"])]
        ctors = set(old[name]["constructors"]) | set(new[name]["constructors"])
        pairs += [(f"{name}.{c}", old[name]["constructors"].get(c), new[name]["constructors"].get(c))
                  for c in sorted(ctors)]
        for label, before, after in pairs:
            out += _param_changes(label, before, after)
    return out


def _param_changes(label: str, before: list | None, after: list | None) -> list[str]:
    if before is None or after is None:
        return [f"{label}: {'new in' if before is None else 'gone from'} torchrl"]
    was, now = {p["name"]: p for p in before}, {p["name"]: p for p in after}
    out = [f"{label}: kwarg {k!r} is gone" for k in was if k not in now]
    out += [f"{label}: kwarg {k!r} is new" for k in now if k not in was]
    out += [f"{label}: kwarg {k!r} changed: {was[k]} -> {now[k]}" for k in now if k in was and was[k] != now[k]]
    if not out and before != after:
        out.append(f"{label}: parameters reordered")
    return out
