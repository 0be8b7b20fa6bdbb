"""Hostile inputs, made on demand: specs, templates and plans that go past every limit of topo.compiler.limits.

Shared by tests/compiler/test_limits.py (exit code, code, limit, no traceback) and
benchmarks/hostile.py (wall time and peak memory of each, in a fresh process).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from topo.compiler.limits import MAX_DEPTH, MAX_NODES, MAX_PLAN_BYTES, MAX_SPEC_BYTES, MAX_TEMPLATE_STEPS, count
from topo.compiler.plan import dumps

HEAD = "version: 1\nenv: {backend: toy}\ntopology: {subcollectors: 2, workers_per_subcollector: 3}\n"


@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]  # after `topo`
    code: str
    says: str  # a piece of the message: the limit, and how far past it the input went


def _laughs(levels: int = 9) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _toy_plan() -> dict:
    import topo
    from topo.compiler.load import parse

    return topo.compile_source(parse(HEAD, "toy.yaml"))


def write_all(folder: Path) -> list[Case]:
    """Write every hostile input into ``folder``; returns how each must be refused."""
    folder.mkdir(parents=True, exist_ok=True)

    def put(name: str, text: str) -> str:
        (folder / name).write_text(text)
        return str(folder / name)

    limit_nodes = f"(limit {count(MAX_NODES)})"
    limit_depth = f"(limit {MAX_DEPTH})"
    cases = [
        Case("spec-file-9MB", ("validate", put("big.yaml", HEAD + "#" + "x" * (9 * 2**20) + "\n")),
             "spec-too-large", f"{count(9 * 2**20 + len(HEAD) + 2)} bytes (limit {count(MAX_SPEC_BYTES)})"),
        Case("spec-dev-zero", ("validate", "/dev/zero"), "spec-too-large",
             f"more than {count(MAX_SPEC_BYTES)} bytes (limit {count(MAX_SPEC_BYTES)})"),
        Case("spec-300k-nodes", ("validate", put("wide.yaml", HEAD + "x: [" + ",".join("0" * 300_000) + "]\n")),
             "spec-too-large", f"300,015 YAML nodes {limit_nodes}"),
        Case("spec-billion-laughs", ("validate", put("laughs.yaml", HEAD + _laughs())), "yaml-alias-expansion",
             f"4,412,961,528 nodes {limit_nodes}"),
        Case("spec-laughs-30-levels", ("validate", put("laughs30.yaml", HEAD + "a0: &a0 [x, x]\n" + "".join(
            f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]\n" for i in range(1, 31)))), "yaml-alias-expansion",
             f"nodes {limit_nodes}"),
        Case("spec-flow-100000-deep", ("validate", put("deep_flow.yaml", HEAD + "x: " + "[" * 100_000 + "]" * 100_000
                                                      + "\n")), "spec-too-deep", f"at least 1,000 levels deep {limit_depth}"),
        Case("spec-block-3000-deep", ("validate", put("deep_block.yaml", HEAD + "x:\n" + "".join(
            " " * (i + 1) + f"k{i}:\n" for i in range(3000)) + " " * 3001 + "v: 1\n")), "spec-too-deep",
             f"levels deep {limit_depth}"),
        Case("spec-deep-alias", ("validate", put("deep_alias.yaml", HEAD + "d: &d " + "[" * 90 + "]" * 90 + "\nx: "
                                                 + "[" * 20 + "*d" + "]" * 20 + "\n")), "spec-too-deep",
             f"with this alias, the spec nests 111 levels deep {limit_depth}"),
        Case("spec-task-range", ("validate", put("range.yaml", HEAD + "assignment: {tasks: 0-99999999999999}\n")),
             "range-too-large", "100,000,000,000,000 ids in all (limit 1,000,000)"),
        Case("set-value-100000-deep", ("validate", put("set.yaml.j2", HEAD + "x: {{ nest }}\n"),
                                       "--set", "nest=" + "[" * 100_000), "spec-too-deep", limit_depth),
        Case("template-renders-10MB", ("validate", put("output.yaml.j2", HEAD + "{% for i in range(100000) %}"
                                                       "{% for j in range(100) %}# padding\n{% endfor %}{% endfor %}")),
             "spec-too-large", f"renders more than {count(MAX_SPEC_BYTES)} characters"),
        Case("template-loops-10^10", ("validate", put("loops.yaml.j2", HEAD + "{% for i in range(100000) %}"
                                                      "{% for j in range(100000) %}{% endfor %}{% endfor %}")),
             "template-too-long", f"more than {count(MAX_TEMPLATE_STEPS)} steps"),
        Case("template-10GB-string", ("validate", put("mul.yaml.j2", HEAD + 'name: {{ "x" * 10**10 }}\n')),
             "template-too-large", f"10,000,000,000 items (limit {count(MAX_SPEC_BYTES)})"),
        Case("template-doubling", ("validate", put("double.yaml.j2", HEAD + '{% set ns = namespace(s="ab") %}'
                                                   '{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}')),
             "template-too-large", f"(limit {count(MAX_SPEC_BYTES)})"),
        Case("template-billion-laughs", ("validate", put("laughs.yaml.j2", HEAD + "{% for n in range(1) %}"
                                                         + _laughs() + "{% endfor %}")),
             "yaml-alias-expansion", limit_nodes),
        Case("template-20000-parens", ("validate", put("parens.yaml.j2", HEAD + "x: {{ " + "(" * 20_000 + "1"
                                                       + ")" * 20_000 + " }}\n")),
             "spec-too-deep", "deeper than Jinja2 can parse"),
    ]
    plan = json.loads(dumps(_toy_plan()))
    with open(folder / "huge_plan.json", "wb") as handle:  # sparse: no disk used
        handle.write(b'{"format": "topo.plan/1", "subcollectors": [')
        handle.truncate(MAX_PLAN_BYTES + 1024)
    deep = dict(plan, env=dict(plan["env"], kwargs={"x": json.loads("[" * 150 + "]" * 150)}))
    edited = json.loads(json.dumps(plan))
    edited["subcollectors"][1]["workers"][0]["task_id"] = 7
    wrong = json.loads(json.dumps(plan))
    wrong["subcollectors"][0]["workers"][2]["seed"] = "two"
    huge = json.loads(json.dumps(plan))
    huge["subcollectors"][0]["workers"][1]["seed"] = 2**100
    missing = json.loads(json.dumps(plan))
    del missing["subcollectors"][1]["workers"][2]
    cases += [
        Case("plan-file-256MiB", ("launch", str(folder / "huge_plan.json")), "plan-too-large",
             f"{count(MAX_PLAN_BYTES + 1024)} bytes (limit {count(MAX_PLAN_BYTES)})"),
        Case("plan-100000-deep", ("launch", put("deep_plan.json", '{"format": "topo.plan/1", "x": '
                                                + "[" * 100_000 + "]" * 100_000 + "}")),
             "plan-too-deep", "past what Python's JSON reader follows"),
        Case("plan-kwargs-150-deep", ("launch", put("deep_kwargs.json", dumps(deep))), "plan-too-deep",
             "env.kwargs nests 151 levels deep"),
        Case("plan-edited-row", ("launch", put("edited.json", json.dumps(edited))), "plan-edited",
             "subcollectors[1] no longer match"),
        Case("plan-wrong-type", ("launch", put("wrong.json", json.dumps(wrong))), "plan-schema-type",
             'subcollectors[0].workers[2].seed: expected null or int64, got "two" (string)'),
        Case("plan-huge-seed", ("launch", put("huge.json", json.dumps(huge))), "plan-schema-maximum",
             "subcollectors[0].workers[1].seed: 1267650600228229401496703205376 must be <= 9223372036854775807"),
        Case("plan-missing-row", ("launch", put("missing.json", json.dumps(missing))), "plan-inconsistent",
             "subcollectors[1].num_workers: num_workers is 3 but the subcollector lists 2 worker(s)"),
    ]
    return cases


def argv(case: Case) -> list[str]:
    """The command line that runs ``case`` (the CLI of the topo being tested)."""
    import sys

    return [sys.executable, "-m", "topo.cli", *case.argv]


def environment() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200"}
