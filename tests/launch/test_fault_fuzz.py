"""Issue 46's fault fuzz, short (benchmarks/chaos_soak.py ``--preset fault-fuzz``): toy 2 x 4 in async mode for
36 s, a random env worker every ~2 s SIGKILLed, SIGSTOPped (left stopped) or SIGSTOPped then SIGCONTed, on real
torchrl processes: every fault named and recovered, no gap between batches over hang_timeout + 15 s, the stall
watchdog silent, nothing left. The 10-minute fuzz is committed in benchmarks/results/fault_fuzz_toy_async.json."""
import json
import os
import sys

from tests import preimported

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fault_fuzz_async_every_fault_named_and_recovered_no_long_gap_no_stall_nothing_left(tmp_path):
    """Issue 46's fault fuzz for 36 s, at least 6 faults (``--preset fault-fuzz``: toy 2 x 4 in async mode, a random
    env worker every ~2 s SIGKILLed, SIGSTOPped and left, or SIGSTOPped then SIGCONTed after 1-10 s), with
    ``hang_timeout`` 5 s so that stop-continues fall on both sides of it. Over 30 s: the run's start (~20 s here),
    21 s of faults and 15 s to settle, the last recoveries and teardown. A jammed run ends (its jam watch, 45 s
    without a batch) and fails here."""
    out = tmp_path / "fuzz.json"
    done = preimported.run([sys.executable, os.path.join(ROOT, "benchmarks", "chaos_soak.py"), "--preset", "fault-fuzz",
                           "--minutes", "0.6", "--min-faults", "6", "--hang-timeout", "5", "--continue-after", "1,10",
                           "--settle", "15", "--stall-timeout", "30", "--jam-s", "45", "--sample-s", "2",
                           "--out", str(out)],
                           capture_output=True, text=True, timeout=600)
    assert out.exists(), done.stderr[-4000:]
    r = json.loads(out.read_text())
    checks = {k: v for k, v in r["checks"].items() if k != "trainer_and_subcollectors_flat"}  # 36 s: too short
    failed = [k for k, ok in checks.items() if not ok]
    assert not failed, (failed, r.get("ended"), r.get("counts"), r["left"],
                        [(f["kind"], f["injected_s"], f.get("outcome") or f["found_by"], f["recovered"]) for f in r["faults"]]
                        if r["faults"] and isinstance(r["faults"][0], dict) else r["faults"], r["stderr"]["text"][-40:])
    counts = r["counts"]
    assert counts["longest_gap_s"] <= 5 + 15 and counts["stalls_named"] == 0 and counts["batches"] > 0
    assert counts["faults"] >= 6 and all(k["injected"] == k["named"] == k["recovered"] for k in counts["by_kind"].values())
    named = {f["kind"]: f.get("cause", {}).get("kind") for f in r["faults"] if f["kind"] != "stop-continue"}
    assert set(named) <= {"kill-worker", "hang-worker"} and all(
        v == ("worker-died" if k == "kill-worker" else "worker-hung") for k, v in named.items())
    assert r["batches"]["delivered"] == r["batches"]["full"] > 0 and r["exit_code"] == 0
