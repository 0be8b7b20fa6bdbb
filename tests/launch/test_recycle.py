"""Health budgets on real torchrl (nothing mocked): one run of 3 x 2 workers in which one worker leaks memory,
one slows down and one ends an episode every 5 steps; each one's subcollector is recycled between batches,
once, with restart seeds, no restart budget spent and no batch lost; nothing the run started is left."""
from __future__ import annotations

import json
import sys
import time

import pytest

from topo.runtime.episodes import Episodes
from topo.launch.supervision.lives import restart_seed

from tests import preimported
from tests.launch.launch_helpers import HANG_GUARD_S, HERE, alive, subprocess_env, user_spec, write
from tests.launch.script_events import parse

pytestmark = pytest.mark.slow
BATCHES = 30
FRAMES = 60  # 10 steps per worker per batch
TOY_RSS_GB = 0.3  # what a toy worker holds (torch imported), measured: 280-290 MB
LEAK_MB = 4  # per step: the leaking worker crosses TOY_RSS_GB + 0.15 GB within ~40 steps


@pytest.fixture(scope="module")
def recycled(tmp_path_factory):
    folder = tmp_path_factory.mktemp("recycle")
    spec = user_spec("unhealthy:unhealthy", 3, 2, leak_seed=1, leak_mb=LEAK_MB, slow_seed=2, short_seed=5,
                     episode_steps=5)
    spec["collector"] = {"frames_per_batch": FRAMES}
    spec["launch"]["recycle"] = {"max_rss_gb": TOY_RSS_GB + 0.15, "max_latency_drift": 3, "max_episodes": 10}
    spec["launch"]["record_actions"] = True
    path = write(folder / "spec.yaml", spec)
    done = preimported.run([sys.executable, str(HERE / "recycling.py"), str(path), "--batches", str(BATCHES),
                           "--report", str(folder / "report")], env=subprocess_env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    events = list(parse(done.stdout))
    return done, events, time.time(), folder / "report"


def test_each_unhealthy_worker_s_subcollector_is_recycled_once_naming_it(recycled):
    done, events, _, _ = recycled
    assert done.returncode == 0, done.stderr
    report = events[-1]["report"]
    assert report["ok"] and report["restarts"] == []  # recycles spend no restart budget (launch.restarts off)
    by_sub = {r["subcollector"]: r for r in report["recycles"]}
    assert len(report["recycles"]) == 3 and sorted(by_sub) == [0, 1, 2]
    assert [(by_sub[c]["breach"]["budget"], by_sub[c]["breach"]["worker"]) for c in range(3)] == [
        ("max_rss_gb", 1), ("max_latency_drift", 0), ("max_episodes", 1)]
    assert [by_sub[c]["row"]["seed"] for c in range(3)] == [1, 2, 5]  # the plan rows of the planted workers
    assert by_sub[0]["breach"]["value"] > TOY_RSS_GB + 0.15 and by_sub[1]["breach"]["value"] > 3
    assert by_sub[2]["breach"]["value"] == 11  # 1 + 2 resets a batch: past 10 after the 5th batch, checked then
    assert all(r["outcome"] == "collecting" and r["first_batch"]["status"] == "ok" for r in report["recycles"])
    assert events[-1]["recycles"] == report["recycles"]  # run.recycles, as the trainer saw it at the end
    line = ("recycled subcollector 0 (worker 1, plan row global_index 1 seed 1: rss ")
    assert line in done.stderr and "> max_rss_gb 0.45) in " in done.stderr


def test_no_batch_is_lost_and_the_rebuilt_workers_have_restart_seeds_and_new_pids(recycled):
    done, events, _, _ = recycled
    batches = [e for e in events if e["event"] == "batch"]
    assert [b["frames"] for b in batches] == [FRAMES] * BATCHES  # exactly what was asked
    report = events[-1]["report"]
    assert report["launch"]["batches_per_subcollector"] == [BATCHES] * 3  # every start's batches, summed
    for r in report["recycles"]:
        planned = [2 * r["subcollector"], 2 * r["subcollector"] + 1]  # seeds base 0: seed = global index
        assert r["seeds"] == {"planned": [restart_seed(s, 1, 6) for s in planned],
                              "applied": [restart_seed(s, 1, 6) for s in planned]}
        assert r["breach"]["pid"] in r["replaced"]["workers"]
        assert not set(r["started"]["workers"]) & set(r["replaced"]["workers"])
        assert r["started"]["subcollector"] != r["replaced"]["subcollector"]
    assert report["seeds"]["mismatches"] == []
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 12}


def test_nothing_the_run_started_is_left(recycled):
    _, events, t_end, _ = recycled
    report = events[-1]["report"]
    p = report["processes"]
    assert p["left_behind"] == [] and p["alive_after"] == []
    pids = set(p["started"]) | {pid for pid in p["worker_pids"] + p["subcollector_pids"] if pid}
    for r in report["recycles"]:
        pids |= {pid for pid in [r["replaced"]["subcollector"], *r["replaced"]["workers"]] if pid}
    assert len(pids) >= 3 + 3 + 2 * 6  # first starts, recycles, every worker of both
    assert alive(pids, t_end) == []


def test_an_episode_of_the_leaking_worker_replays_from_its_rows_in_each_life(recycled):
    """The worked example (docs/guides/provenance.md): the leaking worker's episode, cut when its subcollector
    was recycled, replays up to its last written steps; the rebuilt worker's episode (restart seeds) too."""
    done, _, _, report_dir = recycled
    assert done.returncode == 0, done.stderr
    episodes = Episodes(str(report_dir))
    before, after = episodes.get("w1-r0-e0"), episodes.get("w1-r1-e0")  # plan row 1: leak_seed 1
    assert before.end is None and before.chunks  # SIGKILLed with its subcollector: no end, chunks written
    assert after.summary()["seed"] == restart_seed(1, 1, 6)
    for e in (before, after):
        replayed = preimported.run([sys.executable, "-m", "topo", "replay", str(report_dir), str(e.id), "--format", "json"],
                                   env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
        out = json.loads(replayed.stdout)
        assert replayed.returncode == 0 and out["identical"] and out["steps"] > 0, (replayed.stdout, replayed.stderr)
