"""Rules on the policy section."""
from __future__ import annotations

import importlib.util

from topo.diagnostics import Diagnostic, error
from topo.compiler.spec import Spec
from topo.compiler.rules.context import Context


def importable(module: str) -> bool:
    """Whether ``module`` can be imported here (its parent packages are imported to find it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def policy(spec: Spec, ctx: Context) -> list[Diagnostic]:
    """The policy factory can be imported here; its options fit its placement."""
    p = spec.policy
    if p is None:
        return []
    out = []
    module = p.factory.partition(":")[0]
    if not importable(module):
        out.append(error("policy-factory-not-found", f"module {module!r} of policy factory {p.factory!r} is not importable",
                         ("policy", "factory"), "put its folder on PYTHONPATH, or install its package"))
    if p.placement == "server" and spec.wrote("policy", "weight_sync"):
        out.append(error("policy-weight-sync-with-server", "weight_sync chooses how subcollector copies receive weights; "
                         "with placement: server, weights go to the server", ("policy", "weight_sync"),
                         "remove weight_sync, or use placement: subcollector"))
    return out
