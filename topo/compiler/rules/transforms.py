"""Rules on ``env.transforms``: each item names one transform torchrl has (or a ``module:callable``), with kwargs
its constructor takes, checked against the catalogue (:mod:`topo.compiler.transform_catalog`) without torch."""
from __future__ import annotations

import difflib
import json
import re
from typing import Any

from topo.compiler.rules.context import Context
from topo.compiler.rules.policy import importable
from topo.compiler.spec import Spec, Transform
from topo.compiler.transform_catalog import catalog
from topo.diagnostics import Diagnostic, error, warning

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
CALLABLE = re.compile(f"^{_DOTTED}:{_DOTTED}$")  # package.module:attribute (dotted: a classmethod, say)
NAMES = "a class of torchrl.envs.transforms (MultiAction), a named constructor (MultiAction.from_vla), " \
        "or package.module:callable"
#: annotations said plainly enough to check a JSON value against (``| None`` aside): anything else is not checked
_JSON_TYPES = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def item_shapes(data: dict) -> list[Diagnostic]:
    """Each item of ``env.transforms`` names one transform: a rule on the spec as written, before it is typed."""
    env = data.get("env")
    items = env.get("transforms") if isinstance(env, dict) else None
    out = []
    for i, item in enumerate(items if isinstance(items, list) else []):
        path = ("env", "transforms", i)
        if item is None or item == {}:
            out.append(error("transform-item", "an empty item names no transform", path, NAMES))
        elif isinstance(item, dict) and len(item) != 1:
            names = ", ".join(map(str, item))
            out.append(error("transform-item", f"a transform item is one name and its kwargs; this one names "
                             f"{len(item)} ({names})", path, "write each transform as its own list item: "
                             "'- Name: {kwarg: value}'"))
        elif isinstance(item, dict) and (not isinstance(next(iter(item)), str) or not next(iter(item))):
            out.append(error("transform-item", f"a transform's name is text, not {next(iter(item))!r}", path,
                             NAMES))
    return out


def transforms(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Every transform is one torchrl has (or an importable callable) with kwargs its constructor takes
    (``transforms_at: subcollector`` in async mode: :mod:`topo.compiler.rules.async_mode`)."""
    out = []
    for t in spec.transforms:
        out += [error("transform-kwarg-name", f"a kwarg's name is text, not {key!r}", _path(t, key),
                      "quote it, or name the kwarg") for key in t.kwargs if not isinstance(key, str)]
        out += _callable(t) if ":" in t.name else _torchrl(t)
    if spec.wrote("env", "transforms_at") and not spec.transforms:
        out.append(warning("transforms-at-unused", "transforms_at places env.transforms, and there are none",
                           ("env", "transforms_at"), "remove transforms_at, or add transforms"))
    out += _repeated(spec.transforms)
    return out + _unexecuted_chunks(spec)


#: reference policies whose ``chunk_size`` kwarg (default 1) is the actions each decision writes
CHUNKED_POLICIES = {"topo.policies.tinyvla:make"}


def _unexecuted_chunks(spec: Spec) -> list[Diagnostic]:
    """A reference policy writing chunks of N > 1 actions needs a ``MultiAction`` in the stack to step them."""
    policy = spec.policy
    if policy is None or policy.factory not in CHUNKED_POLICIES:
        return []
    n = policy.kwargs.get("chunk_size", 1)
    if not isinstance(n, int) or n <= 1 or any(t.name.partition(".")[0] == "MultiAction" for t in spec.transforms):
        return []
    return [error("policy-chunk-unexecuted", f"the policy writes a chunk of {n} actions per decision, and nothing in "
                  "env.transforms steps an env through a chunk", ("policy", "kwargs", "chunk_size"),
                  "add '- MultiAction: {stack_rewards: false}' to env.transforms (one env step per action of a "
                  "chunk), or chunk_size: 1")]


def _path(t: Transform, *more: str) -> tuple:
    """Where item ``t`` (or one of its kwargs) is written: a bare name's item, or the name's key of a mapping."""
    return ("env", "transforms", t.index) + ((t.name,) + more if more or t.kwargs else ())


def _callable(t: Transform) -> list[Diagnostic]:
    if not CALLABLE.match(t.name):
        return [error("transform-callable", f"{t.name!r} is not package.module:callable", _path(t),
                      "e.g. mypkg.transforms:make_stack (a function returning a torchrl Transform)")]
    module = t.name.partition(":")[0]
    if not importable(module):
        return [error("transform-callable-not-found", f"module {module!r} of transform {t.name!r} is not importable",
                      _path(t), "put its folder on PYTHONPATH, or install its package")]
    return []


def _torchrl(t: Transform) -> list[Diagnostic]:
    known = catalog()["transforms"]
    if t.name.count(".") > 1:
        last = t.name.rsplit(".", 1)[-1]
        return [error("transform-unknown", f"{t.name!r} is neither a torchrl transform nor package.module:callable",
                      _path(t), f"write {last}" if last in known else f"write it {t.name.rsplit('.', 1)[0]}:{last}")]
    cls, _, ctor = t.name.partition(".")
    if cls not in known:
        return [error("transform-unknown", f"torchrl {catalog()['torchrl']} has no transform {cls!r}", _path(t),
                      _did_you_mean(cls, list(known), f"{NAMES}; torchrl's are listed in "
                                    "topo/compiler/schemas/torchrl-transforms.json"))]
    entry = known[cls]
    if not ctor:
        return _kwargs(t, entry["params"], cls)
    if ctor not in entry["constructors"]:
        offered = ", ".join(f"{cls}.{c}" for c in entry["constructors"]) or "none"
        return [error("transform-constructor-unknown", f"{cls} has no named constructor {ctor!r}", _path(t),
                      _did_you_mean(ctor, list(entry["constructors"]), f"{cls}'s named constructors: {offered}",
                                    prefix=f"{cls}."))]
    return _kwargs(t, entry["constructors"][ctor], t.name)


def _kwargs(t: Transform, params: list[dict[str, Any]], called: str) -> list[Diagnostic]:
    """The kwargs against the constructor's parameters: unknown, missing, or of a type its annotation rules out."""
    by_name = {p["name"]: p for p in params if p["kind"] in ("positional-or-keyword", "keyword-only")}
    open_ended = any(p["kind"] == "var-keyword" for p in params)
    signature = f"{called}({_signature(params)})"
    out = []
    for key, value in t.kwargs.items():
        if not isinstance(key, str):
            continue  # named above
        p = by_name.get(key)
        if p is None:
            if not open_ended:
                close = difflib.get_close_matches(str(key), list(by_name), n=1)
                said = f"did you mean {close[0]!r}? " if close else ""
                out.append(error("transform-kwarg-unknown", f"{called} takes no kwarg {key!r}", _path(t, key),
                                 f"{said}its signature: {signature}"))
            continue
        wanted = _json_type(p.get("annotation"))
        if wanted and value is not None and not _is(value, wanted):
            out.append(error("transform-kwarg-type", f"{called}'s {key} is {p['annotation']}, got "
                             f"{json.dumps(value, default=str)}", _path(t, key), f"its signature: {signature}"))
    missing = [name for name, p in by_name.items() if p["required"] and name not in t.kwargs]
    if missing:
        out.append(error("transform-kwarg-missing", f"{called} needs {', '.join(map(repr, missing))}", _path(t),
                         f"its signature: {signature}"))
    return out


def _json_type(annotation: str | None) -> tuple[type, ...] | None:
    """The JSON types an annotation such as ``int``, ``bool | None`` or ``Optional[float]`` allows; None when it
    says more than that (a union of others, a tensor, a key...)."""
    if not annotation:
        return None
    bare = re.sub(r"^Optional\[(.*)\]$", r"\1", annotation.strip())
    parts = [part.strip() for part in bare.split("|") if part.strip() != "None"]
    return _JSON_TYPES.get(parts[0]) if len(parts) == 1 else None


def _is(value: Any, wanted: tuple[type, ...]) -> bool:
    return type(value) in wanted  # bool is no int here: JSON true is not 1


def _signature(params: list[dict[str, Any]]) -> str:
    out, starred = [], False
    for p in params:
        if p["kind"] == "keyword-only" and not starred:
            out.append("*")
            starred = True
        prefix = {"var-positional": "*", "var-keyword": "**"}.get(p["kind"], "")
        starred |= p["kind"] == "var-positional"
        text = prefix + p["name"] + (f": {p['annotation']}" if "annotation" in p else "")
        if "default" in p or "default_text" in p:
            text += " = " + (repr(p["default"]) if "default" in p else p["default_text"])
        out.append(text)
    return ", ".join(out)


def _did_you_mean(name: str, options: list[str], otherwise: str, prefix: str = "") -> str:
    lowered = {o.lower(): o for o in options}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f"did you mean {prefix}{lowered[close[0]]}?" if close else otherwise


def _repeated(stack: tuple[Transform, ...]) -> list[Diagnostic]:
    """Two StepCounters writing one step count key: the second counts the same steps again."""
    out, seen = [], set()
    for t in stack:
        if t.name != "StepCounter":
            continue
        key = t.kwargs.get("step_count_key", "step_count")
        if key in seen:
            out.append(error("transform-repeated", f"a second StepCounter writing {key!r}: it counts the same steps "
                             "again, and its max_steps races the first one's", _path(t),
                             "keep one StepCounter, or give this one another step_count_key"))
        seen.add(key)
    return out
