"""Hostile specs, templates and plans: exit 2, the code, the limit and how far past it, never a traceback.

Each input goes through the real CLI in a fresh process (benchmarks/hostile.py measures the time and
memory of the same files). The limits sit far above real topologies: a 10,000-worker spec with a
block and a seed per worker still validates and compiles.
"""
from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

import topo
from topo.errors import SpecError
from topo.compiler.limits import MAX_DEPTH, MAX_NODES, MAX_SPEC_BYTES
from topo.compiler.load import parse

from tests.compiler.hostile_inputs import HEAD, argv, environment, write_all

_FOLDER = tempfile.TemporaryDirectory(prefix="topo-hostile-")  # removed when the test session ends
CASES = write_all(Path(_FOLDER.name))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_hostile_input_is_refused(case):
    result = subprocess.run(argv(case), capture_output=True, text=True, env=environment(), timeout=120)
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out
    assert result.returncode == 2, out
    assert f"error {case.code}" in out, out
    assert case.says in out, out


def test_every_limit_has_a_case():
    codes = {case.code for case in CASES}
    assert {"spec-too-large", "spec-too-deep", "yaml-alias-expansion", "range-too-large", "template-too-long",
            "template-too-large", "plan-too-large", "plan-too-deep", "plan-edited"} <= codes


# --- the limits are exact, and the same through the Python API ----------------------------------------

def _codes(fn) -> list[str]:
    with pytest.raises(SpecError) as caught:
        fn()
    return [d.code for d in caught.value.diagnostics]


def test_depth_limit_is_exact():
    parse("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n", "ok.yaml")  # a document: MAX_DEPTH levels
    assert _codes(lambda: parse("x: " + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "\n", "deep.yaml")) == ["spec-too-deep"]


def test_node_limit_is_exact():
    parse("[" + ",".join("0" * (MAX_NODES - 1)) + "]", "ok.yaml")  # the list and its items: MAX_NODES nodes
    assert _codes(lambda: parse("[" + ",".join("0" * MAX_NODES) + "]", "wide.yaml")) == ["spec-too-large"]


def test_alias_counts_at_its_expanded_size():
    anchor = "a: &a [" + ",".join("0" * 999) + "]\n"  # 1,000 nodes, + 1 for the key
    fits = (MAX_NODES - 1 - 1001) // 1001  # each 'bN: *a' adds 1,001
    parse(anchor + "".join(f"b{i}: *a\n" for i in range(fits)), "ok.yaml")
    text = anchor + "".join(f"b{i}: *a\n" for i in range(fits + 1))
    with pytest.raises(SpecError) as caught:
        parse(text, "many.yaml")
    (d,) = caught.value.diagnostics
    assert (d.code, d.line) == ("yaml-alias-expansion", fits + 2)  # the anchor sits on line 1
    assert f"aliases expand the spec to {1 + 1001 * (fits + 2):,} nodes (limit {MAX_NODES:,})" in d.message


def test_recursive_alias_is_still_reported_as_such():
    assert _codes(lambda: parse("version: 1\nenv: &e {backend: toy, self: *e}\n", "loop.yaml")) == \
        ["yaml-recursive-alias"]


def test_python_api_is_bounded(tmp_path):
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(HEAD + "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join(['*a' if i == 0 else f'*a{i - 1}'] * 10)}]\n" for i in range(8)))
    assert _codes(lambda: topo.load_spec(laughs)) == ["yaml-alias-expansion"]
    assert _codes(lambda: topo.compile_spec(laughs)) == ["yaml-alias-expansion"]
    assert _codes(lambda: parse(" " * (MAX_SPEC_BYTES + 1), "big.yaml")) == ["spec-too-large"]
    template = tmp_path / "t.yaml.j2"
    template.write_text(HEAD + "x: {{ nest }}\n")
    assert _codes(lambda: topo.load_spec(template, {"nest": "[" * 5000})) == ["spec-too-deep"]


# --- templates: bounded, yet everything a real template does still works ------------------------------

def test_a_real_template_renders(tmp_path):
    template = tmp_path / "blocks.yaml.j2"
    template.write_text(
        "version: 1\nenv: {backend: toy}\ntopology: {subcollectors: {{ subs }}, workers_per_subcollector: 4}\n"
        "assignment:\n  blocks:\n{% for s in range(subs|int) %}{% for w in range(4) %}"
        "    - {task: {{ (s * 4 + w) % 3 }}, workers: 1, instruction: '{{ '%s-%03d'|format('t', w) }} "
        "{{ 'x'.center(5) ~ loop.index }}'}\n{% endfor %}{% endfor %}"
        "  seeds: {list: [{{ range(4 * subs|int)|map('string')|join(', ') }}]}\n")
    plan = topo.compile_spec(template, {"subs": "5"})
    rows = [r for s in plan["subcollectors"] for r in s["workers"]]
    assert [r["task_id"] for r in rows] == [g % 3 for g in range(20)]
    assert rows[7]["instruction"] == "t-003   x  4" and [r["seed"] for r in rows] == list(range(20))


def test_template_limits_name_the_line(tmp_path):
    template = tmp_path / "t.yaml.j2"
    template.write_text(HEAD + "name: '{{ \"ab\" * 10 }}'\nx: {{ 'y'|center(10**9) }}\n")
    with pytest.raises(SpecError) as caught:
        topo.load_spec(template)
    (d,) = caught.value.diagnostics
    assert (d.code, d.line) == ("template-too-large", 5)
    assert "filter center is given 1,000,000,000" in d.message


# --- far above real topologies -------------------------------------------------------------------------

def test_10000_worker_spec_with_a_block_and_seed_per_worker(tmp_path):
    spec = {
        "version": 1, "name": "toy-100x100",
        "env": {"backend": "toy"},
        "topology": {"subcollectors": 100, "workers_per_subcollector": 100},
        "assignment": {"blocks": [{"task": g % 10, "workers": 1, "instruction": f"task {g % 10}, worker {g}"}
                                  for g in range(10_000)],
                       "seeds": {"list": [7 * g + 3 for g in range(10_000)]}},
    }
    path = tmp_path / "big.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    result = subprocess.run(argv_for("validate", path), capture_output=True, text=True, env=environment(), timeout=120)
    assert result.returncode == 0, result.stderr
    plan = topo.compile_spec(path)
    rows = [r for s in plan["subcollectors"] for r in s["workers"]]
    assert len(rows) == 10_000 and rows[-1]["seed"] == 7 * 9_999 + 3 and rows[-1]["instruction"] == "task 9, worker 9999"


def argv_for(*args) -> list[str]:
    from tests.compiler.hostile_inputs import Case

    return argv(Case("", tuple(str(a) for a in args), "", ""))
