"""What ``topo doctor`` reports: one host check, ok / warn / FAIL, with a hint. Backends return these too."""
from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    hint: str | None = None
