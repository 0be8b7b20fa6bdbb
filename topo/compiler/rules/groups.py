"""Rules on assignment.groups: group sizes that fit the candidates and the workers."""
from __future__ import annotations

from topo.diagnostics import Diagnostic, error
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context
from topo.compiler.rules.topology import workers_path


def groups(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """Candidates that split into groups; with parallel_repeats, groups that fit in one subcollector and share
    an init state."""
    g = spec.groups
    if not g.declared:
        return []
    out = []
    base = ("assignment", "groups")
    if g.candidate_size % g.size:
        up = (g.candidate_size // g.size + 1) * g.size
        out.append(error(
            "candidate-size-multiple",
            f"candidate_size {g.candidate_size} is not a multiple of group size {g.size} "
            f"({g.candidate_size} % {g.size} = {g.candidate_size % g.size})",
            base + ("candidate_size",), f"use candidate_size {up} or a group size that divides {g.candidate_size}",
        ))
    if not g.parallel_repeats:
        return out
    seen = set()
    for c, m in enumerate(spec.workers):
        if m % g.size and (m, workers_path(spec, c)) not in seen:
            seen.add((m, workers_path(spec, c)))
            lo, hi = (m // g.size) * g.size, (m // g.size + 1) * g.size
            divisors = [d for d in range(1, m + 1) if m % d == 0]
            who = f"subcollector {c} has {m} workers" if len(set(spec.workers)) > 1 else f"{m} workers per subcollector"
            out.append(error(
                "group-size-divides-workers",
                f"{who}, not a multiple of group size {g.size} ({m} % {g.size} = {m % g.size}); "
                f"with parallel_repeats each group needs {g.size} workers of one subcollector",
                workers_path(spec, c),
                f"use {f'{lo} or ' if lo else ''}{hi} workers, or a group size that divides {m} "
                f"({', '.join(map(str, divisors[:12]))})",
            ))
    if spec.init_state_mode == "random":
        out.append(error(
            "random-init-with-parallel-groups",
            "init_states.mode 'random' with parallel_repeats: workers sharing a group id would start from "
            "different init states",
            ("assignment", "init_states", "mode") if spec.wrote("assignment", "init_states") else base,
            "use init_states.mode: cycle (or fixed)",
        ))
    return out
