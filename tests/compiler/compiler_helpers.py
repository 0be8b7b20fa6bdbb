"""Shared helpers of the compiler tests: compile spec dicts and files without the CLI."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

import topo
from topo.load import parse
from topo.plan import compile_checked

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HERE = Path(__file__).resolve().parent
GROUP_ID_OFFSET = 10**6  # the recipe's constant, written out (not imported from topo.assign)


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
