"""torchrl's transforms as data: each one's constructor and named constructors, so the compiler checks
``env.transforms`` without importing torch.

The catalogue (``topo/compiler/schemas/torchrl-transforms.json``) is generated from the installed torchrl by
``python -m topo.compiler.transform_catalog --write`` and held to it by a test (the same command without
``--write`` compares them). Reading it
(:func:`catalog`) imports nothing; :func:`generate` imports torchrl, and only it does.

An entry: ``{"module", "params", "constructors": {name: params}}``; a parameter: ``{"name", "kind", "required",
"default" (when JSON can hold it) or "default_text", "annotation"}`` (``kind``: positional-or-keyword,
keyword-only, var-keyword, var-positional, positional-only).
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any, Callable

CATALOG_FILE = "torchrl-transforms.json"
MODULES = ("torchrl.envs.transforms", "torchrl.envs")  # where a transform is exported, in the order looked up
REGENERATE = "python -m topo.compiler.transform_catalog --write"
_KINDS = {inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional-or-keyword",
          inspect.Parameter.KEYWORD_ONLY: "keyword-only", inspect.Parameter.VAR_KEYWORD: "var-keyword",
          inspect.Parameter.VAR_POSITIONAL: "var-positional", inspect.Parameter.POSITIONAL_ONLY: "positional-only"}


@functools.lru_cache(maxsize=None)
def catalog() -> dict[str, Any]:
    """The shipped catalogue: ``{"torchrl": version, "transforms": {name: entry}}``."""
    return json.loads(resources.files("topo.compiler.schemas").joinpath(CATALOG_FILE).read_text())


def generate() -> dict[str, Any]:
    """The catalogue of the installed torchrl (imports it)."""
    import importlib

    import torchrl
    from torchrl.envs.transforms import Transform

    found: dict[str, Any] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            cls = getattr(module, name, None)
            if inspect.isclass(cls) and issubclass(cls, Transform) and name not in found:
                found[name] = {"module": module_name, "params": params(cls),
                               "constructors": {ctor: params(getattr(cls, ctor)) for ctor in _constructors(cls, Transform)}}
    return {"torchrl": torchrl.__version__, "transforms": dict(sorted(found.items()))}


def _constructors(cls: type, base: type) -> list[str]:
    """Public classmethods of ``cls`` (below ``base``, torchrl's Transform) annotated to return a transform of it."""
    names = set()
    for klass in cls.__mro__[:cls.__mro__.index(base)]:
        for name, value in vars(klass).items():
            if isinstance(value, classmethod) and not name.startswith("_"):
                returned = inspect.signature(getattr(cls, name)).return_annotation
                if _text(returned) in (klass.__name__, cls.__name__, "Self"):
                    names.add(name)
    return sorted(names)


def params(fn: Callable) -> list[dict[str, Any]]:
    """The parameters a caller gives ``fn`` (a class: its constructor's, without ``self``)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        entry: dict[str, Any] = {"name": p.name, "kind": _KINDS[p.kind],
                                 "required": p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
        if p.default is not p.empty:
            if _is_json(p.default):
                entry["default"] = list(p.default) if isinstance(p.default, tuple) else p.default
            else:
                entry["default_text"] = re.sub(r" at 0x[0-9a-f]+", "", repr(p.default))
        if p.annotation is not p.empty:
            entry["annotation"] = _text(p.annotation)
        out.append(entry)
    return out


def _text(annotation: Any) -> str:
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, (list, tuple)) and all(_is_json(v) for v in value)


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
        pairs += [(f"{name}.{c}", old[name]["constructors"].get(c), new[name]["constructors"].get(c)) for c in sorted(ctors)]
        if old[name]["module"] != new[name]["module"]:
            out.append(f"{name}: now exported by {new[name]['module']}, not {old[name]['module']}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the catalogue of the installed torchrl")
    args = parser.parse_args(argv)
    fresh = generate()
    if args.write:
        path = Path(__file__).with_name("schemas") / CATALOG_FILE
        path.write_text(json.dumps(fresh, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {path}: {len(fresh['transforms'])} transforms of torchrl {fresh['torchrl']}")
        return 0
    found = differences(catalog(), fresh)
    print("\n".join(found) or "the catalogue matches the installed torchrl")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
