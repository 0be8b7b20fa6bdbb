"""Rules on task items qualified by their suite (``libero_spatial:3``, ``libero_object:0-9``, ``libero_10:all``):
well formed, one task where one is meant, on a backend with suites, each suite one it can read."""
from __future__ import annotations

from topo.backends import Backend
from topo.compiler.spec import Spec, split_item
from topo.diagnostics import Diagnostic, error

FORMS = "'suite:id', 'suite:a-b' or 'suite:all'"


def qualified(spec: Spec, backend: Backend | None) -> list[Diagnostic]:
    """Every qualified item's form, then (on a backend with suites) each suite the items name, once."""
    out = []
    checked = {spec.env_kwargs.get(backend.suite_key)} if backend is not None and backend.suite_key else set()
    for path, item in spec.qualified:
        split = split_item(item)
        if split is None:
            out.append(error("task-item-malformed", f"task item {item!r} is not {FORMS}", path, _fix(item)))
        elif path[1] in ("blocks", "instructions") and not split[1].isdigit():
            out.append(error("task-item-not-one", f"{item!r} names more than one task, where one task is meant", path,
                             f"name one task: '{split[0]}:3'"))
        elif backend is not None and not backend.suite_key:
            out.append(error("task-suite-unsupported", f"backend {spec.backend!r} has no task suites, so {item!r} "
                             "means nothing", path, f"write the id alone: {split[1]!r}"))
        elif backend is not None and split[0] not in checked:
            checked.add(split[0])
            out += backend.check_suite(split[0], path)
    return out


def _fix(item: str) -> str:
    suite, _, rest = item.partition(":")
    if ":" in rest:
        return "one suite per item, e.g. 'libero_spatial:3'"
    if not suite.strip():
        return f"name the suite before ':', e.g. 'libero_spatial:{rest.strip() or 3}'"
    if not rest.strip():
        return f"an id, a range or all after ':', e.g. '{suite.strip()}:0-9'"
    return f"ids are integers, e.g. '{suite.strip()}:0-9'"
