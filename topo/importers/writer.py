"""A YAML document written line by line, so that every value can carry a comment saying where it came from."""
from __future__ import annotations

import textwrap
from typing import Any, Iterable

import yaml

COMMENT_COLUMN = 36
WIDTH = 110


def document(entries: Iterable[tuple[tuple[str | int, ...], Any, str | None]], header: Iterable[str] = (),
             footer: Iterable[str] = ()) -> str:
    """Block mappings from ``(key path, value, comment)`` entries, given grouped by parent, each value in flow
    style, a path ending in an index a block list's item (given in order); ``header`` and ``footer`` lines become
    comment paragraphs (a line starting with two spaces is an item)."""
    lines = comments(header)
    opened: set[tuple[str | int, ...]] = set()
    for path, value, comment in entries:
        for depth in range(len(path) - 1):
            if path[: depth + 1] not in opened:
                opened.add(path[: depth + 1])
                lines.append("  " * depth + f"{path[depth]}:")
        key = "-" if isinstance(path[-1], int) else f"{path[-1]}:"  # an int last: an item of the parent's list
        text = "  " * (len(path) - 1) + f"{key} {flow(value)}"
        lines.append(f"{text.ljust(COMMENT_COLUMN - 1)} # {comment}" if comment else text)
    return "\n".join(lines + comments(footer)) + "\n"


def flow(value: Any) -> str:
    """One value on one line, as YAML reads it back: ``[2, 3]``, ``{hard_reset: false}``, ``null``, ``'0-9'``."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False, allow_unicode=True)
    return text.split("\n", 1)[0]


def comments(paragraph: Iterable[str]) -> list[str]:
    """Comment lines, wrapped: ``"  item"`` lines indent their continuation."""
    out = []
    for line in paragraph:
        item = line.startswith("  ")
        out += textwrap.wrap(line.strip(), WIDTH, initial_indent="#   " if item else "# ",
                             subsequent_indent="#     " if item else "# ", break_on_hyphens=False) or ["#"]
    return out
