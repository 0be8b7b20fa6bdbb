"""The JSON Schemas (Draft 2020-12) of a spec and of a plan, shipped in the package, and their errors as diagnostics."""
from __future__ import annotations

import difflib
import functools
import json
from dataclasses import replace
from importlib import resources
from typing import Any

from topo.diagnostics import Diagnostic, error

SCHEMA_FILE = "topo-spec.schema.json"
_TYPE_NAMES = {
    "integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
    "object": "a mapping", "array": "a list", "null": "null",
}


@functools.lru_cache(maxsize=None)
def schema(name: str = SCHEMA_FILE) -> dict:
    return json.loads(resources.files("topo.compiler.schemas").joinpath(name).read_text())


@functools.lru_cache(maxsize=None)
def _validator(name: str = SCHEMA_FILE, part: str | None = None):
    from jsonschema import Draft202012Validator, validators

    # JSON Schema counts 2.0 as an integer, but a count written 2.0 is a float that range() refuses
    types = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda checker, value: isinstance(value, int) and not isinstance(value, bool))
    whole = schema(name)
    target = whole if part is None else {"$defs": whole["$defs"], "$ref": f"#/$defs/{part}"}
    return validators.extend(Draft202012Validator, type_checker=types)(target)


def check(data: Any) -> list[Diagnostic]:
    """Every schema violation in ``data``, one diagnostic each, in document order."""
    data_json = _string_keys(data)
    if quick()(data_json):
        return []
    found = violations(data_json)
    return merge_misspelt([replace(d, path=_original_path(data, d.path)) for d in found])


@functools.lru_cache(maxsize=None)
def quick(name: str = SCHEMA_FILE, part: str | None = None):
    """Schema ``name`` (or its ``$defs`` entry ``part``) as a predicate: the fast path (:mod:`topo.compiler.quickschema`)."""
    from topo.compiler.quickschema import compile_schema

    whole = schema(name)
    return compile_schema(whole if part is None else {"$ref": f"#/$defs/{part}"}, whole)


def violations(data: Any, name: str = SCHEMA_FILE, part: str | None = None) -> list[Diagnostic]:
    """Every violation of schema ``name`` (of its ``$defs`` entry ``part``, when given) by JSON data."""
    out: list[Diagnostic] = []
    for err in _validator(name, part).iter_errors(data):
        for d in _diagnostics(err):
            if d not in out:  # jsonschema reports 'required' once per missing key, each naming them all
                out.append(d)
    return out


def _original_path(data: Any, path: tuple) -> tuple:
    """``path`` with the spec's own key types: YAML ``3:`` is the int 3, which the JSON view made "3"."""
    out = []
    for part in path:
        if isinstance(data, dict) and isinstance(part, str) and part not in data and part.isdigit() \
                and int(part) in data:
            part = int(part)
        out.append(part)
        data = data.get(part) if isinstance(data, dict) else data[part] \
            if isinstance(data, list) and isinstance(part, int) and part < len(data) else None
    return tuple(out)


def _string_keys(data: Any) -> Any:
    """JSON objects have string keys; YAML may give ints (``3: ...``)."""
    if isinstance(data, dict):
        return {str(k): _string_keys(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_string_keys(v) for v in data]
    return data


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "mapping",
            type(None): "null"}.get(type(value), type(value).__name__)
    text = json.dumps(value, default=str) if not isinstance(value, (dict, list)) else kind
    return text if kind in ("list", "mapping") else f"{text} ({kind})"


def _diagnostics(err) -> list[Diagnostic]:
    path = tuple(err.absolute_path)
    kind = err.validator
    if kind == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = [k for k in err.instance if k not in err.schema.get("properties", {})]
        return [_unknown_key(path, key, allowed) for key in extra]
    if kind == "required":
        missing = [k for k in err.validator_value if k not in err.instance]
        return [
            error("schema-required", f"missing required key {key!r}", path,
                  f"add '{key}:' under {'/'.join(map(str, path)) or 'the top level'}")
            for key in missing
        ]
    if kind == "type":
        expected = err.validator_value if isinstance(err.validator_value, list) else [err.validator_value]
        want = " or ".join(_TYPE_NAMES.get(t, t) for t in expected)
        return [error("schema-type", f"expected {want}, got {_describe(err.instance)}", path)]
    if kind == "enum":
        options = ", ".join(json.dumps(o) for o in err.validator_value)
        close = difflib.get_close_matches(str(err.instance), [str(o) for o in err.validator_value], n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"one of {options}"
        return [error("schema-enum", f"{_describe(err.instance)} is not one of {options}", path, hint)]
    if kind == "const":
        return [error("schema-const", f"{_describe(err.instance)} must be {json.dumps(err.validator_value)}", path)]
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        rel = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[kind]
        return [error(f"schema-{kind.lower()}", f"{err.instance} must be {rel} {err.validator_value}", path)]
    if kind in ("minItems", "minLength"):
        return [error("schema-empty", f"must not be empty (at least {err.validator_value})", path)]
    if kind == "pattern":
        return [error("schema-pattern", f"{_describe(err.instance)} does not match {err.validator_value!r}", path)]
    if kind == "propertyNames":
        return [error("schema-key", f"key {_describe(err.instance)} is not allowed here: "
                      f"{err.context[0].message if err.context else err.message}", path, "use a task id (an integer)")]
    if kind in ("oneOf", "anyOf"):
        return _one_of(err, path)
    return [error(f"schema-{kind.lower()}", err.message, path)]


def _one_of(err, path) -> list[Diagnostic]:
    """Name what was accepted instead of jsonschema's 'not valid under any of the given schemas'."""
    # inside the value (an item of a list): the alternative of its JSON type says what is wrong, item by item
    inner = [d for sub_err in err.context if len(sub_err.absolute_path) > len(path) for d in _diagnostics(sub_err)]
    if inner:
        return list(dict.fromkeys(inner))
    # the alternative of the same JSON type usually says the real problem (e.g. a negative count)
    for sub_err in sorted(err.context, key=lambda e: len(e.absolute_path), reverse=True):
        if sub_err.validator not in ("type", "const", "oneOf", "pattern"):  # a pattern is no message: the forms are
            inner = _diagnostics(sub_err)
            if inner:
                return [inner[0] if inner[0].hint else replace(inner[0], hint=_null_means(err))]
    forms = [err.schema["title"]] if "title" in err.schema else [_form(sub) for sub in err.validator_value]
    expected = forms[0] if len(forms) == 1 else f"{', '.join(forms[:-1])} or {forms[-1]}"
    return [error("schema-type", f"expected {expected}, got {_describe(err.instance)}", path)]


def _null_means(err) -> str | None:
    """For a key that may also be null: what null means, from its description (``Absent or null (the default):
    every episode is kept.``): the hint for a value out of range."""
    if not any(sub.get("type") == "null" for sub in err.validator_value):
        return None
    said = next((s.strip() for s in str(err.schema.get("description", "")).split(". ") if "null" in s), None)
    return said.rstrip('.') if said else None


def _form(sub: dict) -> str:
    if "$ref" in sub:
        name = sub["$ref"].rsplit("/", 1)[-1]
        title = schema()["$defs"].get(name, {}).get("title")
        return name.replace('_', ' ') + (f" ({title})" if title else "")
    if "const" in sub:
        return json.dumps(sub["const"])
    t = sub.get("type")
    if t == "array":
        return "a list"
    if t == "string" and "pattern" in sub:
        return "a range like '0-7'"
    return _TYPE_NAMES.get(t, str(t))


def _unknown_key(path: tuple, key: str, allowed: list[str]) -> Diagnostic:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f"allowed keys here: {', '.join(allowed)}"
    where = "/".join(map(str, path)) or "the top level"
    d = error("schema-unknown-key", f"unknown key {key!r} in {where}", path + (key,), hint)
    return replace(d, suggestion=close[0]) if close else d


def merge_misspelt(found: list[Diagnostic]) -> list[Diagnostic]:
    """A misspelt required key is one problem, not two: keep 'unknown key ... did you mean', drop 'missing'."""
    meant = {(d.path[:-1], d.suggestion) for d in found if d.suggestion}
    return [d for d in found
            if not (d.code == "schema-required" and (d.path, d.message.split("'")[1]) in meant)]
