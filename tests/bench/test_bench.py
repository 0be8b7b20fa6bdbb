"""`topo bench` for real, in its cheap form: toy workers; asserts counts and shapes, never times.

One bench run (module-scoped: ~5 toy launches) serves every test of it. Its modes: ``recipe`` (for a toy,
``legacy``'s plan exactly, which tests/bench/test_bench_units.py asserts: so ``legacy`` is not launched
again), ``homogeneous``, ``forkserver-preload`` (topo's default, and the forkserver start method: plain
``forkserver`` differs only in its preload, asserted on the plans), ``fork`` and ``capped`` (``workers``
with a cap: spawned workers with worker metadata; ``workers`` alone is what tests/launch launches).

Its topology is 1 x 2 (tests/bench/test_bench_units.py plans 2 x 2): two workers tell one construction per worker
(the recipe's subcollector builds 2) from one per subcollector (homogeneous builds 1), and a cap of 1 from none
(the start slots are the run's); a second subcollector would add a process start to each mode and prove nothing more.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

from tests import preimported
from tests.bench.test_bench_units import SPEC as PLANNED_SPEC

MODES = ("recipe", "homogeneous", "forkserver-preload", "fork", "capped")
WORKER_METADATA = ("forkserver-preload", "fork", "capped")
SPEC = PLANNED_SPEC.replace("topology: {subcollectors: 2, workers_per_subcollector: 2}",
                            "topology: {subcollectors: 1, workers_per_subcollector: 2}").replace("tasks: 0-3", "tasks: 0-1")
assert SPEC != PLANNED_SPEC


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """``topo bench`` over :data:`MODES`, one round: (its output folder, comparison.json, the command's stdout)."""
    tmp = tmp_path_factory.mktemp("bench")
    spec = tmp / "toy.yaml"
    spec.write_text(SPEC)
    out = tmp / "bench"
    done = preimported.run([sys.executable, "-m", "topo.cli", "bench", str(spec), "--repeats", "1", "--cap", "1",
                           "--modes", ",".join(MODES), "--out", str(out)], capture_output=True, text=True,
                           timeout=900, env={**os.environ, "MUJOCO_GL": "egl"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "comparison.json").read_text()), done.stdout


def summary(out, mode: str) -> dict:
    return json.loads((out / "runs" / f"r01-{mode}" / "summary.json").read_text())


@pytest.mark.slow
def test_every_mode_ran_once_and_left_nothing(bench):
    _, result, _ = bench
    assert list(result["modes"]) == list(MODES)
    for mode in MODES:
        assert (result["modes"][mode]["runs"], result["modes"][mode]["ok"]) == (1, 1), mode
        assert result["modes"][mode]["lingering"] == 0, mode


@pytest.mark.slow
def test_constructions_per_mode(bench):
    out, result, _ = bench
    built = {mode: result["modes"][mode]["constructions"] for mode in MODES}
    assert built["homogeneous"] == {"trainer": 0, "server": 0, "subcollector": 1, "worker": 2}  # one per subcollector
    for mode in WORKER_METADATA:
        assert built[mode] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 2}, mode
        assert summary(out, mode)["inherited_gl"] == {"workers": 0, "libraries": []}, mode
    assert summary(out, "capped")["launch"]["peak_concurrent_starts"] == 1
    assert summary(out, "forkserver-preload")["topology"]["start_methods"]["workers"] == "forkserver"
    assert summary(out, "fork")["topology"]["start_methods"]["workers"] == "fork"


@pytest.mark.slow
def test_the_recipe_is_the_baseline_and_builds_every_env_twice(bench):
    out, result, stdout = bench
    assert result["baseline"] == "recipe"
    # legacy's construction: each subcollector builds its workers' envs once more, one distinct callable each
    assert result["modes"]["recipe"]["constructions"] == {"trainer": 0, "server": 0, "subcollector": 2, "worker": 2}
    recipe = summary(out, "recipe")
    assert recipe["plan"]["launch"]["construction"] == "legacy" and recipe["plan"]["env"]["builder"] == "topo.envs.toy:build"
    assert recipe["inherited_gl"]["workers"] == 2  # its subcollectors built envs, so their workers imported mujoco with GL on
    assert result["modes"]["recipe"]["speedup_vs_baseline_median"] == 1.0
    assert all(result["modes"][m]["speedup_vs_baseline_median"] > 0 for m in MODES)
    assert result["modes"]["recipe"]["lower_bound"] is not None  # toy: the recipe's builder is topo's, bounded alike
    assert "x recipe" in stdout.splitlines()[0]


@pytest.mark.slow
def test_memory_per_worker_is_each_workers_own(bench):
    out, result, stdout = bench
    for mode in MODES:
        figures = result["modes"][mode]["worker_peak_rss_mb"]
        assert figures["n"] == 2 and 0 < figures["min"] <= figures["median"] <= figures["max"] < 4096, (mode, figures)
        s = summary(out, mode)
        rows = s["memory"]["workers"]
        assert [(r["subcollector"], r["worker"], r["global_index"]) for r in rows] == [(0, 0, 0), (0, 1, 1)]
        assert [r["pid"] for r in rows] == s["processes"]["worker_pids"], mode  # never a subcollector's (recipe)
        assert all(0 < r["rss_mb"] <= r["peak_rss_mb"] for r in rows), (mode, rows)
        assert s["memory"]["measured"] == 2 and s["memory"]["peak_rss_mb"]["max"] == figures["max"], mode
    assert "worker MB" in stdout.splitlines()[0]


@pytest.mark.slow
def test_startup_phases_in_order_the_chart_and_the_tables(bench):
    out, result, stdout = bench
    for mode in WORKER_METADATA:  # each step after the one before, from real launches
        steps = result["modes"][mode]["phases_s"]
        assert 0 < steps["subcollectors_up"] < steps["workers_started"] < steps["workers_built"] <= steps["all_ready"]
    assert (out / "startup.png").stat().st_size > 0
    assert "parent envs" in stdout and "| forkserver-preload |" in stdout
    assert result["costs_s"]["shared"] > 0 and sorted(os.listdir(out / "plans")) == sorted(
        [f"{m}.json" for m in MODES] + ["single.json"])  # the one worker alone is built as topo builds it


@pytest.mark.slow
def test_bench_sweep_fits_time_to_ready_over_workers(tmp_path):
    """`topo bench --sweep workers=1,3`: two launches of their own (the sweep's points), each started and torn down in
    full, measured as users' benchmarks are."""
    out = tmp_path / "sweep"
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "specs", "toy_sweep.yaml.j2")
    done = preimported.run([sys.executable, "-m", "topo.cli", "bench", spec, "--sweep", "workers=1,3", "--repeats", "1",
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
    done = preimported.run([sys.executable, "-m", "topo.cli", "bench", str(spec), "--cache", "cold", "--out",
                           str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has no model cache on in this spec" in done.stderr
    done = preimported.run([sys.executable, "-m", "topo.cli", "bench", str(spec), "--sweep", "workers", "--out",
                           str(tmp_path / "b")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--sweep takes VAR=V1,V2,..." in done.stderr
