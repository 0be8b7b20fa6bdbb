"""Diagnostics: every problem found in a spec, each with a code, a location and a hint."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Diagnostic:
    """One problem. ``path`` is the key path in the spec, ``line``/``column`` are 1-based."""

    code: str
    severity: str
    message: str
    path: tuple[str | int, ...] = ()
    hint: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None
    suggestion: str | None = field(default=None, compare=False)  # the key a misspelt key most likely meant

    @property
    def is_error(self) -> bool:
        return self.severity == ERROR

    @property
    def dotted_path(self) -> str:
        return format_path(self.path)

    def location(self) -> str:
        where = self.file or "<spec>"
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where

    def format(self) -> str:
        head = f"{self.location()}: {self.severity} {self.code}"
        if self.path:
            head += f" at {self.dotted_path}"
        text = f"{head}: {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text

    def to_dict(self) -> dict:
        data = asdict(self)
        data["path"] = list(self.path)
        del data["suggestion"]
        return data


def error(code: str, message: str, path: Sequence[str | int] = (), hint: str | None = None) -> Diagnostic:
    return Diagnostic(code, ERROR, message, tuple(path), hint)


def warning(code: str, message: str, path: Sequence[str | int] = (), hint: str | None = None) -> Diagnostic:
    return Diagnostic(code, WARNING, message, tuple(path), hint)


def format_path(path: Iterable[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def ids_text(ids: Iterable[int | str]) -> str:
    """Compact ids for a message: ``[0, 1, 2, 5]`` -> ``"0-2, 5"``, ``["libero_goal:0", "libero_goal:1"]`` ->
    ``"libero_goal:0-1"`` (``"none"`` when empty)."""
    ids = list(ids)
    if not ids:
        return "none"
    parts, start, prev = [], ids[0], ids[0]
    for x in ids[1:] + [None]:
        a, b = _numbered(prev), _numbered(x)
        if a is not None and b is not None and a[0] == b[0] and b[1] == a[1] + 1:
            prev = x
            continue
        parts.append(str(start) if start == prev else f"{start}-{a[1]}")
        start = prev = x
    return ", ".join(parts)


def _numbered(key: object) -> tuple[str, int] | None:
    """``(suite, id)`` of a task key (suite "" for an int id); None for anything else."""
    if isinstance(key, int):
        return "", key
    suite, _, n = key.rpartition(":") if isinstance(key, str) else ("", "", "")
    return (suite, int(n)) if suite and n.isdigit() else None


def task_order(key: object) -> tuple:
    """Sort key of task keys: ints in order, then ``"suite:id"`` by suite and numeric id, then None."""
    numbered = _numbered(key)
    return (key is None, numbered or ("", 0))


def sort_key(d: Diagnostic) -> tuple:
    return (d.file or "", d.line or 0, d.column or 0, d.code, d.dotted_path)
