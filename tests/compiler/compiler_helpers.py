"""Shared helpers of the compiler tests: compile spec dicts and files without the CLI."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import topo
from topo.compiler.load import parse
from topo.compiler.plan import compile_checked

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HERE = Path(__file__).resolve().parent
GROUP_ID_OFFSET = 10**6  # the recipe's constant, written out (not imported from topo.compiler.assign)


def spec_text(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def checked_of(data: dict[str, Any], file: str = "spec.yaml"):
    source = parse(spec_text(data), file)
    return source, topo.validate(source)


def compile_dict(data: dict[str, Any], file: str = "spec.yaml") -> dict[str, Any]:
    """The plan of a spec dict that must validate without errors."""
    source, checked = checked_of(data, file)
    assert not checked.errors, "\n".join(d.format() for d in checked.errors)
    return compile_checked(source, checked)


def codes(data: dict[str, Any]) -> list[str]:
    return [d.code for d in checked_of(data)[1].diagnostics]


def rows(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for sub in plan["subcollectors"] for row in sub["workers"]]


def toy(subcollectors: int, workers, **assignment) -> dict[str, Any]:
    """A toy-backend spec dict."""
    data: dict[str, Any] = {
        "version": 1,
        "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": subcollectors, "workers_per_subcollector": workers},
    }
    if assignment:
        data["assignment"] = assignment
    return data


def libero(subcollectors: int, workers, suite: str = "libero_spatial", **assignment) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": 1,
        "env": {"backend": "libero", "kwargs": {"task_suite": suite, "camera_height": 128, "camera_width": 128}},
        "topology": {"subcollectors": subcollectors, "workers_per_subcollector": workers},
        "assignment": assignment,
    }
    return data


# LIBERO's own task names (benchmark/libero_suite_task_map.py), underscores read as spaces
SPATIAL = [
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the black bowl next to the ramekin and place it on the plate",
    "pick up the black bowl from table center and place it on the plate",
    "pick up the black bowl on the cookie box and place it on the plate",
    "pick up the black bowl in the top drawer of the wooden cabinet and place it on the plate",
    "pick up the black bowl on the ramekin and place it on the plate",
    "pick up the black bowl next to the cookie box and place it on the plate",
    "pick up the black bowl on the stove and place it on the plate",
    "pick up the black bowl next to the plate and place it on the plate",
    "pick up the black bowl on the wooden cabinet and place it on the plate",
]
GOAL = {1: "put the bowl on the stove", 3: "open the top drawer and put the bowl inside",
        5: "push the plate to the front of the stove"}
# libero_10 names carry a scene prefix that the benchmark drops
LIBERO_10_TASK_0 = "put both the alphabet soup and the tomato sauce in the basket"


def layout(workers: list[int]):
    """(c, w, g) for every worker, g counted by hand: the sum of the previous subcollectors, plus w."""
    out = []
    for c, count in enumerate(workers):
        first = sum(workers[:c])
        out.extend((c, w, first + w) for w in range(count))
    return out


def assert_layout(plan, workers: list[int]):
    got = [(r["subcollector"], r["index"], r["global_index"]) for r in rows(plan)]
    assert got == layout(workers)
    assert [s["num_workers"] for s in plan["subcollectors"]] == workers
    assert [s["index"] for s in plan["subcollectors"]] == list(range(len(workers)))
    for row in rows(plan):
        assert row["kwargs"]["worker"] == {"subcollector": row["subcollector"], "index": row["index"],
                                           "global_index": row["global_index"]}
