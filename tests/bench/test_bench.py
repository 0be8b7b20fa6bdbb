"""`topo bench` in its cheap form: toy workers, every mode once; asserts counts, never times."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import copy

import pytest

import topo
from topo.bench import compare, sweep
from topo.bench.modes import MODES, model_cache, variant, with_model_cache

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
    ("forkserver-preload", 11.0, 32.0, 16.0),  # the subcollector and its server import; workers construct
    ("fork", 7.0, 28.0, 14.0),
    ("capped", 11.0, 60.0, 30.0),
])
def test_lower_bound_per_mode(mode, chain, work, bound):
    got = compare.lower_bound(mode, compare.Shape(8, 1, 8), COSTS, cores=2, cap=4)
    assert (got["chain_s"], got["work_s"], got["s"]) == (chain, work, bound)


def test_lower_bound_chain_cold_cache_and_cap():
    one = compare.Shape(1, 1, 1)
    assert compare.lower_bound("forkserver-preload", one, COSTS, cores=2)["s"] == 11.0  # the chain, not work / cores
    assert compare.lower_bound("forkserver-preload", compare.Shape(8, 1, 8), COSTS, cores=2, cold=True)["s"] == 17.5
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
    assert workers["speedup_vs_legacy_median"] == 2.0  # round 2 failed: not paired
    assert workers["speedup_at_lower_bound"] == 1.75  # legacy's median ready, 35 s, over the bound
    assert result["modes"]["workers/cold"]["lower_bound"]["s"] == 21.5  # one compile more: 43 s of work
    assert result["modes"]["workers/cold"]["model_cache"] == "cold"
    assert result["rounds"][1]["workers"]["speedup_vs_legacy"] is None
    assert result["startup_chain_s"]["median"] == 5.0
    assert result["modes"]["workers"]["phases_s"] == {"subcollectors_up": 5.0, "workers_started": None,
                                                      "workers_built": None, "all_ready": 20.0}
    assert "| workers | 5.0 | - | - | 20.0 |" in compare.phases(result)
    text = compare.table(result)
    assert "start + imports 4.0 s" in text and "a cold cache adds one compile, 3.0 s" in text
    assert any(line.startswith("workers ") and line.split()[-3:] == ["20.0", "s", "1.00"] for line in text.splitlines())


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


@pytest.mark.slow
def test_bench_every_mode_counts_constructions(tmp_path):
    spec = tmp_path / "toy.yaml"
    spec.write_text(SPEC)
    out = tmp_path / "bench"
    done = subprocess.run([sys.executable, "-m", "topo.cli", "bench", str(spec), "--repeats", "1", "--cap", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MUJOCO_GL": "egl"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "comparison.json").read_text())
    built = {mode: result["modes"][mode]["constructions"] for mode in MODES}
    assert built["legacy"] == {"trainer": 0, "server": 0, "subcollector": 4, "worker": 4}
    assert built["homogeneous"] == {"trainer": 0, "server": 0, "subcollector": 2, "worker": 4}
    for mode in ("workers", "forkserver", "forkserver-preload", "fork", "capped"):
        assert built[mode] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}, mode
        inherited = json.loads((out / "runs" / f"r01-{mode}" / "summary.json").read_text())["inherited_gl"]
        assert inherited == {"workers": 0, "libraries": []}, mode
    legacy = json.loads((out / "runs" / "r01-legacy" / "summary.json").read_text())["inherited_gl"]
    assert legacy["workers"] == 4  # its subcollectors built envs, so their workers imported mujoco with MUJOCO_GL=egl
    for mode in MODES:
        assert result["modes"][mode]["ok"] == 1, mode
        assert result["modes"][mode]["lingering"] == 0, mode
    capped = json.loads((out / "runs" / "r01-capped" / "summary.json").read_text())
    assert capped["launch"]["peak_concurrent_starts"] == 1
    forked = json.loads((out / "runs" / "r01-forkserver" / "summary.json").read_text())
    assert forked["topology"]["start_methods"]["workers"] == "forkserver"
    assert (out / "startup.png").stat().st_size > 0
    assert "parent envs" in done.stdout and "legacy" in done.stdout
    steps = result["modes"]["workers"]["phases_s"]  # each step after the one before, from real launches
    assert 0 < steps["subcollectors_up"] < steps["workers_started"] < steps["workers_built"] <= steps["all_ready"]
    assert "| workers |" in done.stdout


@pytest.mark.slow
def test_bench_sweep_fits_time_to_ready_over_workers(tmp_path):
    out = tmp_path / "sweep"
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "specs", "toy_sweep.yaml.j2")
    done = subprocess.run([sys.executable, "-m", "topo.cli", "bench", spec, "--sweep", "workers=1,3", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MUJOCO_GL": "egl"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "sweep.json").read_text())
    assert result["variable"] == "workers" and result["values"] == ["1", "3"]
    assert list(result["modes"]) == ["forkserver-preload"]  # a sweep runs topo's default mode unless told
    mode = result["modes"]["forkserver-preload"]
    assert [(p["value"], p["workers"], p["runs"], len(p["ready_s"])) for p in mode["points"]] == [("1", 1, 1, 1),
                                                                                                  ("3", 3, 1, 1)]
    assert mode["fit"]["points"] == 2 and mode["fit"]["r2"] == 1.0  # two runs: the line goes through both
    assert all(p["lower_bound_s"] > 0 for p in mode["points"]) and mode["bound_slope_s_per_worker"] > 0
    assert result["costs_s"]["shared"] > result["costs_s"]["construct"]  # a toy worker is nearly all imports
    assert sorted(os.listdir(out / "runs")) == ["r01-forkserver-preload-workers1", "r01-forkserver-preload-workers3"]
    assert result["policy_dropped"] is None and (out / "sweep.png").stat().st_size > 0
    assert "time to ready = " in done.stdout and "s x workers" in done.stdout


def test_bench_refuses_a_cold_cache_without_one(tmp_path):
    spec = tmp_path / "toy.yaml"
    spec.write_text(SPEC)
    done = subprocess.run([sys.executable, "-m", "topo.cli", "bench", str(spec), "--cache", "cold", "--out",
                           str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has no model cache on in this spec" in done.stderr
    done = subprocess.run([sys.executable, "-m", "topo.cli", "bench", str(spec), "--sweep", "workers", "--out",
                           str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--sweep takes VAR=V1,V2,..." in done.stderr
