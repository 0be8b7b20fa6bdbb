"""`topo bench` without launching: the modes as plan variants (``recipe`` among them), each mode's lower bound,
the comparison (ratios to the baseline, memory per worker), the sweep's fit, and the recipe's LIBERO builder."""
from __future__ import annotations

import copy
import json
import os

import pytest

import topo
from topo.bench import compare, sweep
from topo.bench.modes import MODES, baseline, model_cache, own_builder, variant, with_model_cache

SPEC = """\
version: 1
name: toy-bench
env: {backend: toy, kwargs: {success_steps: 4, state_dim: 8}}
topology: {subcollectors: 2, workers_per_subcollector: 2}
assignment: {tasks: 0-3, seeds: {base: 5}}
launch: {startup_timeout: 240}
"""


@pytest.fixture
def plan(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text(SPEC)
    return topo.compile_spec(path)


def test_variants_change_only_how_envs_are_built(plan):
    rows = [r["kwargs"] for s in plan["subcollectors"] for r in s["workers"]]
    for mode in MODES:
        v = variant(plan, mode, cap=3)
        assert [r["kwargs"] for s in v["subcollectors"] for r in s["workers"]] == rows
    assert variant(plan, "legacy")["launch"]["construction"] == "legacy"
    assert variant(plan, "homogeneous")["launch"]["metadata_from_workers"] is False
    assert variant(plan, "workers")["launch"]["metadata_from_workers"] is True
    assert variant(plan, "forkserver")["start_methods"]["workers"] == "forkserver"
    assert variant(plan, "forkserver")["launch"]["preload"] is None
    assert "torch" in variant(plan, "forkserver-preload")["launch"]["preload"]
    assert "topo.envs.toy" in variant(plan, "forkserver-preload")["launch"]["preload"]
    assert variant(plan, "fork")["start_methods"]["workers"] == "fork"
    assert variant(plan, "fork")["launch"]["preload"] is None
    assert variant(plan, "capped", cap=3)["launch"]["max_concurrent_starts"] == 3
    with pytest.raises(ValueError):
        variant(plan, "turbo")


def test_variants_drop_the_policy_and_use_the_bench_cache(plan, tmp_path):
    plan = {**plan, "policy": {"factory": "topo.policies.tinyvla:make", "kwargs": {}, "placement": "subcollector",
                               "device": "cpu", "weight_sync": None}}
    assert all(variant(plan, mode)["policy"] is None for mode in MODES)  # bench measures env startup
    assert not model_cache(plan) and with_model_cache(plan, str(tmp_path)) is plan  # toy: no cache
    cached = copy.deepcopy(plan)
    for env in (cached["env"], *(row["kwargs"]["env"] for sub in cached["subcollectors"] for row in sub["workers"])):
        env["options"] = {"model_cache": True, "skip_unread_renders": False}
    moved = with_model_cache(cached, "rel/cache")
    dirs = {env["options"]["model_cache"] for env in (moved["env"], *(row["kwargs"]["env"] for sub in moved["subcollectors"]
                                                                       for row in sub["workers"]))}
    assert dirs == {os.path.abspath("rel/cache")}
    assert moved["env"]["options"]["skip_unread_renders"] is False and cached["env"]["options"]["model_cache"] is True


COSTS = compare.Costs(shared=4.0, construct=2.0, reset=1.0, compile=3.0)


@pytest.mark.parametrize("mode, chain, work, bound", [
    ("legacy", 27.0, 76.0, 38.0),  # 9 importing processes, 8 parent envs built one after another
    ("homogeneous", 13.0, 62.0, 31.0),
    ("workers", 11.0, 60.0, 30.0),
    ("forkserver", 11.0, 60.0, 30.0),
    ("forkserver-preload", 7.0, 28.0, 14.0),  # the run's one forkserver imports; subcollector and workers forked
    ("fork", 7.0, 28.0, 14.0),
    ("capped", 11.0, 60.0, 30.0),
])
def test_lower_bound_per_mode(mode, chain, work, bound):
    got = compare.lower_bound(mode, compare.Shape(8, 1, 8), COSTS, cores=2, cap=4)
    assert (got["chain_s"], got["work_s"], got["s"]) == (chain, work, bound)


def test_lower_bound_chain_cold_cache_and_cap():
    one = compare.Shape(1, 1, 1)
    assert compare.lower_bound("forkserver-preload", one, COSTS, cores=2)["s"] == 7.0  # the chain, not work / cores
    assert compare.lower_bound("forkserver-preload", compare.Shape(8, 1, 8), COSTS, cores=2, cold=True)["s"] == 15.5
    two = compare.lower_bound("forkserver-preload", compare.Shape(8, 2, 4), COSTS, cores=2)
    assert two["importing_processes"] == 1 and two["chain_s"] == 7.0  # one server for both subcollectors
    assert compare.lower_bound("capped", compare.Shape(8, 1, 8), COSTS, cores=16, cap=1)["s"] == 16.0  # 8 x 2 s, one at a time
    two = compare.lower_bound("legacy", compare.Shape(8, 2, 4), COSTS, cores=64)
    assert two["chain_s"] == 19.0 and two["importing_processes"] == 10 and two["parent_envs"] == 8


def test_comparison_ratios_and_costs_from_single_workers():
    summary = {"constructions": {"by_role": {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}},
               "processes": {"peak": 9, "alive_after": []}}
    runs = [
        {"mode": "legacy", "round": 1, "exit_code": 0, "peak_rss_gb": 1.0,
         "summary": {**summary, "timings_s": {"all_ready": 40.0, "first_batch": 41.0, "subcollectors_up": 5.0}}},
        {"mode": "workers", "round": 1, "exit_code": 0, "peak_rss_gb": 1.0,
         "summary": {**summary, "timings_s": {"all_ready": 20.0, "first_batch": 21.0, "subcollectors_up": 5.0}}},
        {"mode": "legacy", "round": 2, "exit_code": 0, "peak_rss_gb": 1.0,
         "summary": {**summary, "timings_s": {"all_ready": 30.0, "first_batch": 31.0, "subcollectors_up": 5.0}}},
        {"mode": "workers", "round": 2, "exit_code": 1, "peak_rss_gb": 1.0, "summary": None},
        {"mode": "workers/cold", "round": 1, "exit_code": 0, "peak_rss_gb": 1.0,
         "summary": {**summary, "timings_s": {"all_ready": 25.0, "first_batch": 26.0}}},
    ]
    # construction: 2 s of wall time, 3 s of CPU (a software renderer's threads): the work counts CPU seconds
    singles = [{"wall_s": 9.0, "start_s": 0.5, "imports_s": 3.5, "construct_s": 2.0, "reset_s": 1.0, "cold": False,
                "start_cpu_s": 0.5, "imports_cpu_s": 3.5, "construct_cpu_s": 3.0, "reset_cpu_s": 1.0},
               {"wall_s": 12.0, "start_s": 0.5, "imports_s": 3.5, "construct_s": 5.0, "reset_s": 1.0, "cold": True,
                "start_cpu_s": 0.5, "imports_cpu_s": 3.5, "construct_cpu_s": 6.0, "reset_cpu_s": 1.0}]
    result = compare.comparison(runs, singles, compare.Shape(4, 2, 2), cores=2,
                                labels=["legacy", "workers", "workers/cold"], model_cache=True)
    assert result["costs_s"] == {"shared": 4.0, "construct": 2.0, "reset": 1.0, "compile": 3.0, "cpu": {
        "shared": 4.0, "construct": 3.0, "reset": 1.0, "compile": 3.0, "cpu": None}}
    assert result["single_worker"]["warm"]["unshared_s"]["median"] == 3.0
    workers = result["modes"]["workers"]
    assert workers["ok"] == 1 and workers["all_ready_s"]["median"] == 20.0 and workers["model_cache"] == "warm"
    # 6 importing processes x 4 s + 4 workers x (3 + 1) s = 40 CPU seconds on 2 cores; the chain: 4 + 4 + 2 + 1 s
    assert workers["lower_bound"] == {"s": 20.0, "chain_s": 11.0, "work_s": 40.0, "importing_processes": 6,
                                      "parent_envs": 0}
    assert workers["ratio_to_lower_bound"] == 1.0
    assert result["baseline"] == "legacy"  # no recipe in this run: legacy is the baseline
    assert workers["speedup_vs_baseline_median"] == 2.0  # round 2 failed: not paired
    assert workers["speedup_at_lower_bound"] == 1.75  # legacy's median ready, 35 s, over the bound
    assert result["modes"]["workers/cold"]["lower_bound"]["s"] == 21.5  # one compile more: 43 s of work
    assert result["modes"]["workers/cold"]["model_cache"] == "cold"
    assert result["rounds"][1]["workers"]["speedup_vs_baseline"] is None
    assert workers["worker_peak_rss_mb"] is None  # reports without a memory section (an older topo): no figure
    assert result["startup_chain_s"]["median"] == 5.0
    assert result["modes"]["workers"]["phases_s"] == {"subcollectors_up": 5.0, "workers_started": None,
                                                      "workers_built": None, "all_ready": 20.0}
    assert "| workers | 5.0 | - | - | 20.0 |" in compare.phases(result)
    text = compare.table(result)
    assert "start + imports 4.0 s" in text and "a cold cache adds one compile, 3.0 s" in text
    assert any(line.startswith("workers ") and line.split()[-4:] == ["20.0", "s", "1.00", "-"] for line in text.splitlines())
    assert "x legacy" in text.splitlines()[0]


def test_sweep_fit_and_parse():
    assert sweep.fit([(1, 7.0), (2, 9.0), (4, 13.0), (8, 21.0)]) == {
        "slope_s_per_worker": 2.0, "intercept_s": 5.0, "r2": 1.0, "points": 4}
    noisy = sweep.fit([(1, 7.0), (1, 8.0), (2, 9.0), (4, 14.0)])
    assert 0 < noisy["r2"] < 1 and noisy["points"] == 4
    assert sweep.fit([(4, 1.0), (4, 2.0)]) is None  # one N: no slope
    assert sweep.parse("workers=1, 2,4") == ("workers", ["1", "2", "4"])
    for bad in ("workers", "workers=1", "=1,2"):
        with pytest.raises(ValueError):
            sweep.parse(bad)
    shapes = {"1": compare.Shape(1, 1, 1), "4": compare.Shape(4, 1, 4)}
    runs = [{"mode": "fork", "value": v, "exit_code": 0, "summary": {"timings_s": {"all_ready": t, "first_batch": t}}}
            for v, t in (("1", 6.0), ("4", 12.0))]
    out = sweep.result(runs, shapes, COSTS, cores=2, labels=["fork"])["fork"]
    assert out["fit"]["slope_s_per_worker"] == 2.0 and out["fit"]["intercept_s"] == 4.0
    assert [p["lower_bound_s"] for p in out["points"]] == [7.0, 8.0]  # the chain at 1 worker; 16 s of work at 4
    assert out["bound_slope_s_per_worker"] == 1.5  # construct + reset per worker, on 2 cores


# -- the recipe mode ------------------------------------------------------------------------------

def libero_like(plan: dict) -> dict:
    """``plan`` as the libero backend writes it: its builder, and the builder's options in every row."""
    out = copy.deepcopy(plan)
    out["env"].update(backend="libero", builder="topo.envs.libero:build", options={"model_cache": True})
    for row in (row for sub in out["subcollectors"] for row in sub["workers"]):
        row["kwargs"].update(backend="libero", builder="topo.envs.libero:build")
        row["kwargs"]["env"]["options"] = {"model_cache": True, "skip_unread_renders": True}
    return out


def test_recipe_is_legacy_with_the_backends_builder_without_a_recipe_builder(plan):
    recipe, legacy = variant(plan, "recipe"), variant(plan, "legacy")
    assert recipe["name"] == "toy-bench [recipe]"
    assert {**recipe, "name": None} == {**legacy, "name": None}  # toy: the recipe is legacy, exactly
    assert not own_builder(plan, "recipe")  # the single worker measured alone bounds it too


def test_recipe_builds_torchrls_plain_env_with_the_builders_options_off(plan):
    from topo.compiler import planfile
    from topo.compiler.plan import dumps

    libero = libero_like(plan)
    recipe = variant(libero, "recipe")
    rows = [row["kwargs"] for sub in recipe["subcollectors"] for row in sub["workers"]]
    assert recipe["env"]["builder"] == "topo.envs.libero:build_recipe" and "options" not in recipe["env"]
    assert all(k["builder"] == "topo.envs.libero:build_recipe" and "options" not in k["env"] for k in rows)
    assert (recipe["launch"]["construction"], recipe["launch"]["metadata_from_workers"]) == ("legacy", False)
    assert recipe["start_methods"]["workers"] == "spawn" and recipe["launch"]["preload"] is None
    before = [row["kwargs"] for sub in libero["subcollectors"] for row in sub["workers"]]
    assert [{**k, "builder": None, "env": {**k["env"], "options": None}} for k in rows] == \
        [{**k, "builder": None, "env": {**k["env"], "options": None}} for k in before]  # else the same rows
    assert all(k["env"]["options"]["model_cache"] for k in before)  # the plan it came from is untouched
    assert variant(libero, "legacy")["env"]["builder"] == "topo.envs.libero:build"  # legacy keeps topo's builder
    assert own_builder(libero, "recipe") and not own_builder(libero, "legacy")
    assert not model_cache(recipe) and with_model_cache(recipe, "anywhere") is recipe
    planfile.check(json.loads(dumps(recipe)), require_digest=True)  # topo launch runs it as it is


def test_the_recipe_builder_is_libero_env_with_only_the_two_fix_ups(monkeypatch):
    import torchrl.envs

    from topo.envs import libero

    calls = []

    class PlainLiberoEnv:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    monkeypatch.setattr(torchrl.envs, "LiberoEnv", PlainLiberoEnv)
    monkeypatch.setattr(libero, "prepare_libero", lambda: calls.append("config seeded"))
    monkeypatch.setattr(libero, "load_init_states", lambda suite, task: calls.append((suite, task)) or "npz states")
    monkeypatch.setattr(libero, "gl_renderer", lambda: "llvmpipe")
    env = {"task_suite": "libero_spatial", "task_id": 3, "camera_height": 64, "env_kwargs": {"hard_reset": False},
           "options": {"model_cache": True, "skip_unread_renders": True}}
    built = libero.build_recipe(env)
    assert type(built) is PlainLiberoEnv  # not TopoLiberoEnv: none of the builder's options
    assert built.kwargs == {"task_suite": "libero_spatial", "task_id": 3, "camera_height": 64,
                            "env_kwargs": {"hard_reset": False}, "init_states": "npz states"}
    assert calls == ["config seeded", ("libero_spatial", 3)]
    assert built.topo_render_device["renderer"] == "llvmpipe" and built.topo_render_device["egl_device"] is None
    assert "options" in env  # the row is not changed
    given = libero.build_recipe({**env, "init_states": "given"})
    assert given.kwargs["init_states"] == "given" and len(calls) == 3  # init states given: none loaded


def test_the_baseline_is_the_recipe_when_it_ran():
    assert MODES[0] == "recipe" and baseline(list(MODES)) == "recipe"
    assert baseline(["workers", "legacy", "fork"]) == "legacy"
    assert baseline(["workers/cold", "fork"]) is None


def run_with_memory(mode: str, ready: float, peaks: list[float | None], exit_code: int = 0) -> dict:
    summary = {"constructions": {"by_role": {"trainer": 0, "server": 0, "subcollector": 0, "worker": len(peaks)}},
               "processes": {"peak": 9, "alive_after": []},
               "timings_s": {"all_ready": ready, "first_batch": ready + 1, "subcollectors_up": 2.0},
               "memory": {"workers": [{"subcollector": 0, "worker": w, "global_index": w, "rss_mb": p and p - 10,
                                       "peak_rss_mb": p} for w, p in enumerate(peaks)]}}
    return {"mode": mode, "round": 1, "exit_code": exit_code, "peak_rss_gb": 1.0, "summary": summary}


def test_the_comparison_gives_memory_per_worker_and_ratios_to_the_recipe():
    runs = [run_with_memory("recipe", 60.0, [1900.0, 2000.0, 1950.0, None]),  # one worker never read its memory
            run_with_memory("legacy", 40.0, [1700.0, 1750.0, 1800.0, 1720.0]),
            run_with_memory("forkserver-preload", 15.0, [1600.0, 1650.0, 1610.0, 1690.0])]
    singles = [{"wall_s": 9.0, "start_s": 0.5, "imports_s": 3.5, "construct_s": 2.0, "reset_s": 1.0}]
    result = compare.comparison(runs, singles, compare.Shape(4, 1, 4), cores=2,
                                labels=["recipe", "legacy", "forkserver-preload"], model_cache=True,
                                own_builder={"recipe"})
    modes = result["modes"]
    assert result["baseline"] == "recipe"
    assert modes["recipe"]["worker_peak_rss_mb"] == {"min": 1900.0, "median": 1950.0, "max": 2000.0, "n": 3}
    assert modes["forkserver-preload"]["worker_peak_rss_mb"] == {"min": 1600.0, "median": 1630.0, "max": 1690.0, "n": 4}
    assert modes["forkserver-preload"]["speedup_vs_baseline_median"] == 4.0  # 60 s / 15 s
    assert modes["legacy"]["speedup_vs_baseline_median"] == 1.5 and modes["recipe"]["speedup_vs_baseline_median"] == 1.0
    # the recipe builds another env than the worker measured alone: no bound, no model cache of topo's
    assert modes["recipe"]["lower_bound"] is None and modes["recipe"]["model_cache"] is None
    assert modes["recipe"]["ratio_to_lower_bound"] is None and modes["legacy"]["model_cache"] == "warm"
    assert modes["forkserver-preload"]["speedup_at_lower_bound"] == round(60.0 / modes["forkserver-preload"]["lower_bound"]["s"], 3)
    lines = compare.table(result).splitlines()
    assert "x recipe" in lines[0] and "worker MB" in lines[0]
    row = {line.split()[0]: line.split() for line in lines[1:4]}
    assert row["recipe"][-3:] == ["-", "-", "1950/2000"] and row["forkserver-preload"][-1] == "1630/1690"
    assert row["forkserver-preload"][-5] == "4.00"
    assert compare.worker_memory([run_with_memory("x", 1.0, [None])]) is None
    assert compare.worker_memory([{"summary": None}]) is None

