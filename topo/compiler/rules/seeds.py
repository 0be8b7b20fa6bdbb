"""Rules on assignment.seeds."""
from __future__ import annotations

from collections import Counter

from topo.diagnostics import Diagnostic, error, ids_text
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context

SEED_LIMIT = 2**63


def seeds(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """One distinct 63-bit seed per worker."""
    out = []
    path = ("assignment", "seeds")
    if spec.seed_list is not None:
        if len(spec.seed_list) != spec.total_workers:
            out.append(error("seeds-list-length", f"seeds.list has {len(spec.seed_list)} seeds for {spec.total_workers} workers",
                             path + ("list",), "give exactly one seed per worker, or use base/strategy"))
        big = sorted(s for s in set(spec.seed_list) if s >= SEED_LIMIT)
        if big:
            out.append(error("seed-overflow", f"seed(s) {ids_text(big)} in seeds.list do not fit in 63 bits (2**63 = "
                             f"{SEED_LIMIT})", path + ("list",), "use seeds below 2**63"))
        dup = sorted(s for s, n in Counter(spec.seed_list).items() if n > 1)
        if dup:
            out.append(error("seeds-duplicate", f"seed(s) {ids_text(dup)} appear more than once in seeds.list: "
                             "workers would share a random stream", path + ("list",), "make every seed distinct"))
        if spec.wrote(*path, "strategy") or spec.wrote(*path, "base"):
            out.append(error("seeds-list-and-strategy", "seeds.list replaces base/strategy; give one or the other",
                             path, "remove base/strategy, or remove list"))
    elif spec.seed_strategy == "offset" and spec.seed_base + spec.total_workers > SEED_LIMIT:
        out.append(error("seed-overflow", f"base {spec.seed_base} + {spec.total_workers} workers exceeds 2**63",
                         path + ("base",), "use a smaller base seed"))
    return out
