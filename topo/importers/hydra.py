"""A Hydra config read as plain YAML, as Hydra would hand it to a job: command-line overrides applied
(``key=value``, ``+key=value``, ``++key=value``, ``~key``), then ``${...}`` interpolations resolved.

Node references resolve (``${env.seed}``, relative ``${.seed}``, inside strings too); resolvers
(``${oc.env:VAR}``, ``${now:...}``) and dangling or circular references do not: they are named, with their
key path, for the caller to report. Defaults lists (config composition) are not followed.
"""
from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from topo.diagnostics import Diagnostic, error
from topo.errors import SpecError
from topo.compiler.load import Source, load

OVERRIDE = re.compile(r"(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?:=(?P<value>.*))?", re.S)
INTERPOLATION = re.compile(r"(?<!\\)\$\{([^${}]*)\}")
NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
RESOLVE_HINT = ("let Hydra compose and resolve it (python vla-grpo.py --config-name NAME --cfg job --resolve > "
                "cfg.yaml), or --set the key")


@dataclass
class Config:
    """The config after overrides and interpolation, and where each key came from."""

    source: Source  # the file as written: text and key locations
    data: dict
    overridden: set[tuple] = field(default_factory=set)  # key paths set on the command line
    unresolved: dict[tuple, str] = field(default_factory=dict)  # key path -> why it stays an interpolation

    def locate(self, d: Diagnostic) -> Diagnostic:
        """``d`` placed at its key in the file, or at the --set that gave the key its value."""
        if tuple(d.path) in self.overridden:
            return replace(d, file="--set")
        return self.source.place(d)


def read(path: str, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``path`` and apply ``overrides``; raises :class:`SpecError` (exit 2) on bad input."""
    source = load(path)
    if not isinstance(source.data, dict):
        raise SpecError([source.place(error("import-not-a-mapping", "a Hydra config is a mapping of sections", ()))])
    if "defaults" in source.data:
        raise SpecError([source.place(error(
            "import-defaults-list", "this config composes others through a defaults list, which topo does not follow",
            ("defaults",), "pass the composed config: python vla-grpo.py --config-name NAME --cfg job --resolve "
                           "> cfg.yaml"))])
    data, overridden, problems = apply_overrides(source.data, overrides)
    if problems:
        raise SpecError(problems)
    data, unresolved = resolve(data)
    return Config(source, data, overridden, unresolved)


def apply_overrides(data: dict, overrides) -> tuple[dict, set[tuple], list[Diagnostic]]:
    """A copy of ``data`` with Hydra-style overrides applied, the paths they set, and what was refused."""
    out = copy.deepcopy(data)
    overridden, problems = set(), []
    for text in overrides:
        m = OVERRIDE.fullmatch(text.strip())
        prefix = m and m.group("prefix")
        if m is None or (m.group("value") is None and prefix != "~"):
            problems.append(_set_error("set-syntax", f"--set expects key=value (Hydra override), got {text!r}", (),
                                       "e.g. --set collector.num_collectors=5, +env.new_key=1, ~env.old_key"))
            continue
        path = tuple(m.group("key").split("."))
        parent = _parent(out, path, create=prefix in ("+", "++"))
        exists = isinstance(parent, dict) and path[-1] in parent
        if prefix == "~":
            if not exists:
                problems.append(_set_error("set-unknown-key", f"cannot delete {'.'.join(path)}: no such key", path))
                continue
            del parent[path[-1]]
        elif prefix == "+" and exists:
            problems.append(_set_error("set-key-exists", f"{'.'.join(path)} is already in the config", path,
                                       f"override it with {'.'.join(path)}=..., or ++{'.'.join(path)}=..."))
            continue
        elif not prefix and not exists:
            problems.append(_set_error("set-unknown-key", f"{'.'.join(path)} is not in the config", path,
                                       _did_you_mean(parent, path) + f"add it with +{'.'.join(path)}=..."))
            continue
        elif not isinstance(parent, dict):
            problems.append(_set_error("set-unknown-key", f"{'.'.join(path[:-1])} is not a section", path))
            continue
        else:
            parent[path[-1]] = parse_value(m.group("value"))
        overridden.add(path)
    return out, overridden, problems


def parse_value(text: str) -> Any:
    """An override's value as Hydra types it: YAML scalars and flow lists/maps, floats such as 5e-6 included."""
    if text == "":
        return ""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and NUMBER.fullmatch(text.strip()):  # 5e-6: YAML 1.1 reads a string
        return float(value)
    return value


def resolve(data: dict) -> tuple[dict, dict[tuple, str]]:
    """``data`` with every resolvable interpolation replaced; the rest kept as written, with why."""
    unresolved: dict[tuple, str] = {}

    def walk(node: Any, path: tuple) -> Any:
        if isinstance(node, dict):
            return {k: walk(v, path + (k,)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, path + (i,)) for i, v in enumerate(node)]
        try:
            value = _interpolate(node, path, data, (path,))
        except _Unresolvable as exc:
            unresolved[path] = str(exc)
            return node
        return value.replace("\\${", "${") if isinstance(value, str) else value

    return walk(data, ()), unresolved


class _Unresolvable(Exception):
    pass


def _interpolate(value: Any, path: tuple, root: dict, chain: tuple) -> Any:
    if not isinstance(value, str) or not INTERPOLATION.search(value):
        return value

    def target(expr: str) -> Any:
        if ":" in expr:
            raise _Unresolvable(f"${{{expr}}} calls a resolver")
        key = _reference(expr.strip(), path)
        if key in chain:
            raise _Unresolvable(f"${{{expr}}} refers back to itself")
        found, ok = _get(root, key)
        if not ok:
            raise _Unresolvable(f"${{{expr}}}: no key {'.'.join(map(str, key))}")
        return _interpolate(found, key, root, chain + (key,))

    whole = INTERPOLATION.fullmatch(value)
    if whole:
        return target(whole.group(1))
    while INTERPOLATION.search(value):  # innermost first: ${a.${b}} resolves b, then a.<b>
        value = INTERPOLATION.sub(lambda m: str(target(m.group(1))), value, count=1)
    return value


def _reference(expr: str, path: tuple) -> tuple:
    """The key path ``${expr}`` names, from the key at ``path``: absolute, or relative with leading dots."""
    dots = len(expr) - len(expr.lstrip("."))
    base = path[:-dots] if dots else ()
    rest = expr[dots:].replace("[", ".").replace("]", "")
    return base + tuple(int(p) if p.isdigit() else p for p in rest.split(".") if p)


def _get(root: Any, key: tuple) -> tuple[Any, bool]:
    node = root
    for part in key:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None, False
    return node, True


def _parent(data: dict, path: tuple, create: bool) -> Any:
    node: Any = data
    for part in path[:-1]:
        if isinstance(node, dict) and part not in node and create:
            node[part] = {}
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _did_you_mean(parent: Any, path: tuple) -> str:
    if not isinstance(parent, dict):
        return ""
    close = difflib.get_close_matches(path[-1], [str(k) for k in parent], n=1)
    return f"did you mean {'.'.join(path[:-1] + (close[0],))!r}? " if close else ""


def _set_error(code: str, message: str, path: tuple, hint: str | None = None) -> Diagnostic:
    return replace(error(code, message, path, hint), file="--set")
