"""Property tests over random valid toy specs: layout, groups, seeds, coverage, determinism, JSON."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import topo
from topo.compiler.load import parse
from topo.compiler.plan import compile_checked, dumps
from topo.compiler.planfile import check, seal

from tests.compiler.compiler_helpers import GROUP_ID_OFFSET, rows, spec_text

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _task_field(draw, tasks: list[int]):
    """The same task list written in one of the spec's forms: an id, a range, a list of ids and ranges."""
    if len(tasks) == 1 and draw(st.booleans()):
        return tasks[0]
    if tasks == list(range(tasks[0], tasks[-1] + 1)) and len(tasks) > 1 and draw(st.booleans()):
        return f"{tasks[0]}-{tasks[-1]}"
    return list(tasks)


@st.composite
def valid_specs(draw):
    n = draw(st.integers(1, 4))
    parallel = draw(st.booleans())
    declared = parallel or draw(st.booleans())
    size = draw(st.integers(1, 4)) if declared else 1
    if parallel:
        per_sub = [size * draw(st.integers(1, 4)) for _ in range(n)]
    else:
        per_sub = [draw(st.integers(1, 8)) for _ in range(n)]
    uniform = draw(st.booleans())
    if uniform:
        per_sub = [per_sub[0]] * n
    total = sum(per_sub)
    units = total // size if parallel else total

    assignment: dict = {}
    if declared:
        groups = {"size": size, "candidate_size": size * draw(st.integers(1, 3))}
        if parallel or draw(st.booleans()):
            groups["parallel_repeats"] = parallel
        assignment["groups"] = groups
    modes = ["cycle", "fixed"] if parallel else ["random", "cycle", "fixed"]
    if parallel or draw(st.booleans()):
        assignment["init_states"] = {"mode": draw(st.sampled_from(modes)), "id": draw(st.integers(0, 60))}

    if draw(st.booleans()):
        # blocks: consecutive runs, each a multiple of the group size with parallel repeats
        step = size if parallel else 1
        left, blocks = total // step, []
        while left:
            k = draw(st.integers(1, left))
            block = {"task": draw(st.integers(0, 30)), "workers": k * step}
            if draw(st.booleans()):
                block["instruction"] = draw(st.text("abcdefgh ", min_size=1, max_size=12)).strip() or "x"
            blocks.append(block)
            left -= k
        assignment["blocks"] = blocks
    elif draw(st.booleans()):
        t = draw(st.integers(1, min(units, 6)))
        first = draw(st.integers(0, 20))
        contiguous = draw(st.booleans())
        tasks = list(range(first, first + t)) if contiguous else \
            draw(st.lists(st.integers(0, 40), min_size=t, max_size=t, unique=True))
        assignment["tasks"] = _task_field(draw, tasks)
        if draw(st.booleans()):
            assignment["instructions"] = {tasks[0]: "override"}

    kind = draw(st.sampled_from(["offset", "sequence", "list", "none"]))
    if kind == "offset":
        assignment["seeds"] = {"base": draw(st.integers(0, 10**9))}
    elif kind == "sequence":
        assignment["seeds"] = {"base": draw(st.integers(0, 10**9)), "strategy": "sequence"}
    elif kind == "list":
        assignment["seeds"] = {"list": draw(st.lists(st.integers(0, 10**12), min_size=total, max_size=total,
                                                     unique=True))}
    data = {
        "version": 1,
        "name": "prop",
        "env": {"backend": "toy", "kwargs": {"success_steps": draw(st.integers(1, 9)), "state_dim": 8}},
        "topology": {"subcollectors": n, "workers_per_subcollector": per_sub[0] if uniform and draw(st.booleans())
                     else per_sub},
    }
    if assignment:
        data["assignment"] = assignment
    if draw(st.booleans()):
        data["collector"] = {"sync": False}
    return data, per_sub


def _compile(data):
    source = parse(spec_text(data), "prop.yaml")
    checked = topo.validate(source)
    assert not checked.errors, "\n".join(d.format() for d in checked.errors)
    return compile_checked(source, checked)


@SETTINGS
@given(valid_specs())
def test_layout_groups_seeds_coverage(case):
    data, per_sub = case
    plan = _compile(data)
    r = rows(plan)
    total = sum(per_sub)

    # every global index exactly once, contiguous, in order, g = offset(c) + w
    assert [x["global_index"] for x in r] == list(range(total))
    assert [s["num_workers"] for s in plan["subcollectors"]] == per_sub
    for x in r:
        assert x["global_index"] == sum(per_sub[: x["subcollector"]]) + x["index"]

    # groups: complete, and each group inside one subcollector with one task and init state
    cov = plan["coverage"]
    assert cov["groups"]["incomplete"] == []
    assert cov["groups"]["complete"] == cov["groups"]["count"]
    groups = data.get("assignment", {}).get("groups") or {}
    size = groups.get("size", 1) if groups.get("parallel_repeats") else 1
    members: dict[int, list] = {}
    for x in r:
        assert x["group_id_offset"] == x["group"] * GROUP_ID_OFFSET
        assert x["group"] == x["global_index"] // size
        members.setdefault(x["group"], []).append(x)
    assert cov["groups"]["count"] == len(members) == total // size
    for group in members.values():
        assert len(group) == size
        assert len({(m["subcollector"], m["task_id"], m["init_state_mode"], m["init_state_id"]) for m in group}) == 1

    # seeds unique, and as the spec says
    seeds = [x["seed"] for x in r]
    assert len(set(seeds)) == total
    spec_seeds = data.get("assignment", {}).get("seeds") or {}
    if "list" in spec_seeds:
        assert seeds == spec_seeds["list"]
    elif spec_seeds.get("strategy") != "sequence":
        assert seeds == [spec_seeds.get("base", 0) + g for g in range(total)]

    # coverage recounted
    recount = Counter(x["task_id"] for x in r)
    assert {t["task_id"]: t["workers"] for t in cov["tasks"]} == dict(recount)
    assert sum(t["workers"] for t in cov["tasks"]) == cov["workers"] == total
    assert cov["instructions_per_subcollector"] == [
        len({x["instruction"] for x in sub["workers"]}) for sub in plan["subcollectors"]]

    # tasks follow the recipe
    tasks_field = data.get("assignment", {}).get("tasks")
    if tasks_field is not None:
        items = tasks_field if isinstance(tasks_field, list) else [tasks_field]
        tasks = []
        for item in items:
            if isinstance(item, str):
                lo, hi = map(int, item.split("-"))
                tasks.extend(range(lo, hi + 1))
            else:
                tasks.append(item)
        for x in r:
            unit = x["global_index"] // size
            assert x["task_id"] == tasks[unit % len(tasks)]


@SETTINGS
@given(valid_specs())
def test_deterministic_and_json_round_trip(case):
    data, _ = case
    first, second = _compile(data), _compile(data)
    text = dumps(first)
    assert text == dumps(second)
    assert json.loads(text) == seal(first)
    assert dumps(json.loads(text)) == text
    assert check(json.loads(text), require_digest=True) == []  # topo reads every plan it writes


# --- robustness: a spec broken anywhere gets diagnostics, never an exception -------------------------

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 10), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
    st.text(max_size=8), st.sampled_from(["all", "0-3", "3-0", "libero", "toy", "cycle", "fork", "x:y"]),
    st.lists(st.integers(-2, 5), max_size=4), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, path + (i,))


@st.composite
def broken_specs(draw):
    data, _ = draw(valid_specs())
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(LEAVES)
    return data


@SETTINGS
@given(broken_specs())
def test_broken_specs_never_raise(data):
    source = parse(spec_text(data), "broken.yaml")
    checked = topo.validate(source)
    for d in checked.diagnostics:
        assert d.code and d.message and d.file == "broken.yaml"
    if not checked.errors:
        plan = compile_checked(source, checked)
        assert json.loads(dumps(plan)) == seal(plan)


YAML_BITS = st.sampled_from(
    list("ab01:-[]{}&*!<>|'\"#%@`,?\n \t.")
    + ["!!binary ", "!!set ", "<<: ", "&a ", "*a", "2024-13-45", "!!python/name:os.system", "!!int x", ".nan", "~",
       "---\n", "...\n", "!!timestamp 20x", "version: 1\n", "env: {backend: toy}\n"])


@SETTINGS
@example("!!timestamp 20x")
@example("a: &a [*a]")
@example("<<: {a: 1}")
@given(st.lists(YAML_BITS, max_size=40).map("".join))
def test_any_text_gives_diagnostics_not_exceptions(text):
    try:
        source = parse(text, "fuzz.yaml")
    except topo.SpecError as err:
        assert err.diagnostics and all(d.code and d.file == "fuzz.yaml" for d in err.diagnostics)
        return
    topo.validate(source)


@SETTINGS
@given(broken_specs())
def test_quick_schema_agrees_with_jsonschema(data):
    from topo.compiler import schema

    as_json = schema._string_keys(data)
    assert schema.quick()(as_json) == (not schema.violations(as_json))


@pytest.mark.parametrize("edit", [
    {"version": True}, {"version": 1.0}, {"version": "1"}, {"assignment": {"instructions": {"a": "x"}}},
    {"assignment": {"instructions": {"3": "x"}}}, {"assignment": {"tasks": " 3 - 5 "}}, {"assignment": {"tasks": [1.0]}},
    {"topology": {"subcollectors": 2, "workers_per_subcollector": [2, 2.0]}}, {"collector": {"sync": 1}},
    {"assignment": {"render_gpus": None}}, {"topology": {"subcollectors": 2, "workers_per_subcollector": True}},
])
def test_quick_schema_agrees_on_edge_cases(edit):
    from topo.compiler import schema

    data = {"version": 1, "env": {"backend": "toy"}, "topology": {"subcollectors": 2, "workers_per_subcollector": 2},
            **edit}
    assert schema.quick()(data) == (not schema.violations(data))
