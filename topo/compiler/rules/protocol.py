"""Rules on a named eval protocol (``eval.protocol``): its backend, the suites it runs, what it fixes left to it."""
from __future__ import annotations

from topo.compiler.protocols import PROTOCOLS
from topo.compiler.rules.context import Context
from topo.compiler.spec import Spec
from topo.diagnostics import Diagnostic, error, warning

PATH = ("eval",)


def protocol(spec: Spec, ctx: Context) -> list[Diagnostic]:
    p = spec.eval.protocol if spec.eval is not None else None
    if not p:
        return []
    named = PROTOCOLS[p["name"]]
    out = []
    if spec.backend != named.backend:
        out.append(error("protocol-backend", f"the {p['name']} protocol evaluates env.backend {named.backend!r}, "
                         f"not {spec.backend!r}", PATH + ("protocol",), f"use env.backend: {named.backend}"))
    for key in p["overridden"]:
        out.append(error("protocol-fixes", f"the {p['name']} protocol fixes eval.{key}", PATH + (key,),
                         f"remove eval.{key} (docs/guides/evaluation.md: the protocol's numbers and their sources)"))
    for item in p["qualified"]:
        out.append(error("protocol-task-suite", f"with a protocol, eval.tasks are ids within each suite, not "
                         f"{item!r}", PATH + ("tasks",), "name the suites in eval.suites, e.g. suites: [libero_goal]"))
    for suite in p["suites"]:
        if suite not in p["horizons"]:
            out.append(error("protocol-suite", f"suite {suite!r} is none of the {p['name']} protocol's "
                             f"({', '.join(named.horizons)}), nor a perturbation of one: it has no step horizon",
                             PATH + ("suites",), "name a standard suite, or one that perturbs it"))
    if p["narrowed"]:
        said = ", ".join(f"{key} {value}" for key, value in p["narrowed"].items())
        out.append(warning("protocol-narrowed", f"the {p['name']} protocol is narrowed ({said}): its rates are not "
                           "comparable with the full protocol's", PATH, "leave suites, tasks and init_states out for "
                           "the full protocol"))
    return out
