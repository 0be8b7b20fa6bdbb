"""`topo bench` in its cheap form: toy workers, every mode once; asserts counts, never times."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import topo
from topo.bench import compare
from topo.bench.modes import MODES, variant

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


def test_lower_bound_and_paired_ratios():
    assert compare.lower_bound(8, 12.5, 2) == 50.0
    assert compare.lower_bound(1, 12.5, 2) == 12.5
    summary = {"constructions": {"by_role": {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}},
               "processes": {"peak": 9, "alive_after": []}}
    runs = [
        {"mode": "legacy", "round": 1, "exit_code": 0, "peak_rss_gb": 1.0,
         "summary": {**summary, "timings_s": {"all_ready": 40.0, "first_batch": 41.0}}},
        {"mode": "workers", "round": 1, "exit_code": 0, "peak_rss_gb": 1.0,
         "summary": {**summary, "timings_s": {"all_ready": 20.0, "first_batch": 21.0}}},
        {"mode": "legacy", "round": 2, "exit_code": 0, "peak_rss_gb": 1.0,
         "summary": {**summary, "timings_s": {"all_ready": 30.0, "first_batch": 31.0}}},
        {"mode": "workers", "round": 2, "exit_code": 1, "peak_rss_gb": 1.0, "summary": None},
    ]
    singles = [{"wall_s": 10.0, "imports_s": 1, "construct_s": 2, "reset_s": 3}]
    result = compare.comparison(runs, singles, workers=4, cores=2, modes=["legacy", "workers"])
    assert result["lower_bound_s"] == 20.0
    assert result["modes"]["workers"]["ok"] == 1
    assert result["modes"]["workers"]["all_ready_s"]["median"] == 20.0
    assert result["modes"]["workers"]["speedup_vs_legacy_median"] == 2.0  # round 2 failed: not paired
    assert result["modes"]["workers"]["ratio_to_lower_bound"] == 1.0
    assert result["rounds"][1]["workers"]["speedup_vs_legacy"] is None
    assert result["speedup_at_lower_bound"] == 1.75  # legacy's median ready 35.0 s / the bound 20.0 s
    assert "lower bound 20.0 s = 4 workers x 10.0 s" in compare.table(result)
    assert "the lower bound would be 1.75x legacy" in compare.table(result)
    for run in runs[:3]:  # the subcollectors were up 5.0 s after launch: workers could start no sooner
        run["summary"]["timings_s"]["subcollectors_up"] = 5.0
    result = compare.comparison(runs, singles, workers=4, cores=2, modes=["legacy", "workers"])
    assert result["startup_chain_s"]["median"] == 5.0
    assert result["modes"]["workers"]["phases_s"] == {"subcollectors_up": 5.0, "workers_started": None,
                                                      "workers_built": None, "all_ready": 20.0}
    assert "| workers | 5.0 | - | - | 20.0 |" in compare.phases(result)
    assert result["speedup_at_lower_bound"] == 1.4  # 35.0 s / (5.0 s + 20.0 s)
    assert "taking 5.0 s of collector and subcollector imports, then the lower bound" in compare.table(result)


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
