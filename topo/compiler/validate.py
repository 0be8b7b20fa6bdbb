"""Validation: the JSON Schema, then the topology rules (:mod:`topo.compiler.rules`). Every problem at once, each located."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from topo.compiler import schema
from topo.backends import Backend, TaskCatalog
from topo.diagnostics import Diagnostic, error, sort_key
from topo.compiler.load import Source
from topo.compiler.rules import RULES, context
from topo.compiler.rules.transforms import item_shapes
from topo.compiler.rules.untyped import backend_alone, not_json, too_many_ids
from topo.compiler.spec import Spec, from_data


@dataclass
class Checked:
    """What validation produced: diagnostics, and the typed spec when the rules could run."""

    diagnostics: list[Diagnostic]
    spec: Spec | None = None
    backend: Backend | None = None
    catalog: TaskCatalog | None = None

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if not d.is_error]


def validate(source: Source) -> Checked:
    """Check ``source`` against the schema and every topology rule."""
    found = schema.check(source.data)
    spec = None
    backend = catalog = None
    if isinstance(source.data, dict):
        refused = [_value_path(d.path) for d in found if not d.suggestion]
        repaired = _without(_respelt(source.data, found), [d.path for d in found if not d.suggestion])
        while True:  # a value taken out may leave its mapping without a key it requires: that mapping goes too
            left = [d.path for d in schema.check(repaired) if d.path]
            fewer = _without(repaired, left)
            if fewer == repaired:  # each pass takes something out, or ends
                break
            refused += [_value_path(path) for path in left]
            repaired = fewer
        too_wide = too_many_ids(repaired)
        found += too_wide + item_shapes(source.data)
        if not too_wide and not schema.check(repaired):
            spec = from_data(repaired)
            ctx, said = context(spec)
            checked = said
            for rule in RULES:
                checked += rule(spec, ctx)
            # on a value the schema refused (a key, a list with a bad item), its error is what to fix first
            found += [d for d in checked if not any(_touches(d, path) for path in refused)]
            backend, catalog = ctx.backend, ctx.catalog
        else:
            found += backend_alone(repaired)
        reported = {d.path for d in found}
        found += [d for d in not_json(source.data, ()) if d.path not in reported]
    elif not found:
        found.append(error("schema-type", "the spec must be a mapping of sections", ()))
    aliases = {d.path[:-1] + (d.suggestion,): d.path for d in found if d.suggestion}
    placed = sorted((source.place(d, aliases) for d in found), key=sort_key)
    return Checked(placed, spec, backend, catalog)


def _value_path(path: tuple) -> tuple:
    """The key whose value holds ``path``: a list item's list."""
    while path and isinstance(path[-1], int):
        path = path[:-1]
    return path


def _touches(d: Diagnostic, refused: tuple) -> bool:
    """Whether ``d`` is about the value at ``refused``: at it or inside it, or a rule finding its key missing (at
    the mapping that holds it)."""
    if d.code.endswith("-missing") and d.path == refused[:-1]:
        return True
    return bool(refused) and d.path[:len(refused)] == refused


def _without(data: dict, paths: list[tuple]) -> dict:
    """A copy of ``data`` without the values that failed the schema (a bad list item: only the item), so the rules can
    still run."""
    out = copy.deepcopy(data)
    for path in paths:
        node: Any = out
        for part in path[:-1]:
            try:
                node = node[part] if not isinstance(node, dict) else node.get(part, node.get(_as_int(part)))
            except (IndexError, TypeError, KeyError):
                node = None
            if node is None:
                break
        if not path or node is None:
            continue
        key = path[-1]
        if isinstance(node, dict):
            node.pop(key, None)
            node.pop(_as_int(key), None)
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node[key] = _GONE
    return _strip(out)


_GONE = object()  # a list item that failed the schema


def _strip(node: Any) -> Any:
    """``node`` without the list items marked gone; a list left empty goes too."""
    if isinstance(node, dict):
        kept = {k: _strip(v) for k, v in node.items()}
        return {k: v for k, v in kept.items() if v is not _GONE}
    if isinstance(node, list):
        kept = [x for x in map(_strip, node) if x is not _GONE]
        return kept if kept or not node else _GONE
    return node


def _respelt(data: dict, found: list[Diagnostic]) -> dict:
    """A copy of ``data`` with each misspelt key renamed to what it most likely meant."""
    out = copy.deepcopy(data)
    for d in found:
        if not d.suggestion:
            continue
        node: Any = out
        for part in d.path[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and d.suggestion not in node and d.path[-1] in node:
            node[d.suggestion] = node.pop(d.path[-1])
    return out


def _as_int(key: Any) -> Any:
    return int(key) if isinstance(key, str) and key.isdigit() else key
