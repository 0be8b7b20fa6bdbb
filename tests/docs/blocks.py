"""The code blocks of README.md and docs/**/*.md, and which of them run (docs/contributing.md).

A fenced block whose info string starts with ``bash`` or ``python`` is run, unless the info string also
has the word ``norun``; every other block (``console``, ``text``, ``yaml``, ``toml``, ``json``, none,
MyST directives) is shown, not run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ("bash", "python")
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    path: str       # relative to the repository root
    line: int       # the opening fence's line, from 1
    language: str
    words: tuple    # the rest of the info string
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN and "norun" not in self.words


def pages() -> list[Path]:
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)
    return [ROOT / "README.md", *docs]


def blocks(path: Path) -> list[Block]:
    found, lines, i = [], path.read_text(encoding="utf-8").split("\n"), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent, info = m["fence"], len(m["indent"]), m["info"].strip().split()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ *{re.escape(fence[0])}{{{len(fence)},}}\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        found.append(Block(str(path.relative_to(ROOT)), i + 1, info[0] if info else "", tuple(info[1:]),
                           "\n".join(body) + "\n"))
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in blocks(p)]
