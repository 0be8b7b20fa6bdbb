"""``topo top`` and ``topo runs trace`` on a fabricated run directory: markers, heartbeat slots, episode files,
batch records and events as a run writes them, no process started."""
from __future__ import annotations

import json
import os
import subprocess
import time

from click.testing import CliRunner

from topo.runtime import heartbeat
from topo.runtime.episodes import EpisodeId
from topo.cli import main
from topo.runtime.live import Reader, view
from topo.runtime.rundir import HOST, RunDir

NOW = 1000.0
PLAN = {"name": "fab", "collector": {"sync": True, "frames_per_batch": 8},
        "launch": {"hang_timeout": 30, "stall_timeout": 20, "recycle": {"max_rss_gb": 1.0}},
        "subcollectors": [{"index": c, "num_workers": 3, "workers": [
            {"subcollector": c, "index": w, "global_index": 3 * c + w, "task_id": w, "instruction": f"task {w}"}
            for w in range(3)]} for c in range(2)]}


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def marker(run: RunDir, name: str, c: int, w: int, at: float, pid: int, restart: int = 0, **fields) -> None:
    run.add("markers", {"name": name, "pid": pid, "host": HOST, "time": at, "restart": restart,
                        "worker": {"subcollector": c, "index": w, "global_index": 3 * c + w}, **fields})


def slots(path: str, rows: list[tuple]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        for row in rows:
            f.write(heartbeat.SLOT.pack(*row).ljust(heartbeat.STRIDE, b"\0"))  # a slot, then its timings


def episodes(run_dir: str, life: str, *records: dict) -> None:
    os.makedirs(os.path.join(run_dir, "episodes"), exist_ok=True)
    with open(os.path.join(run_dir, "episodes", life + ".jsonl"), "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def fabricated(tmp_path, shift: float = 0.0) -> str:
    """Subcollector 0: w0 steps (an episode in flight), w1 hangs in a step, w2 is dead; subcollector 1, recycled
    once: its start 1 has w0 stepping past its memory budget and drifting, w1 built but idle, w2 not built. Times
    as at :data:`NOW`, plus ``shift``."""
    t = lambda x: x + shift if x else x  # noqa: E731
    path = str(tmp_path / "topo-run-fab")
    os.makedirs(path)
    with open(os.path.join(path, "launch.json"), "w") as f:
        json.dump({"plan": PLAN}, f)
    run, me, gone = RunDir(path), os.getpid(), dead_pid()
    for w, pid in enumerate((me, me, gone)):
        marker(run, "started", 0, w, t(10.0), pid)
        marker(run, "constructed", 0, w, t(20.0), pid, seed=w, seconds=10.0)
    marker(run, "started", 1, 0, t(10.0), me)  # the first start of subcollector 1, then its recycle
    for w in range(2):
        marker(run, "started", 1, w, t(500.0), me, restart=1)
        marker(run, "constructed", 1, w, t(510.0), me, restart=1, seed=w, seconds=10.0)
    marker(run, "started", 1, 2, t(500.0), me, restart=1)
    # (started, ended, memory at, pid, rss, peak, steps, mean, baseline, resets)
    slots(heartbeat.path(path, 0, 0), [(t(990.0), t(985.0), 0, 0, 0, 0, 0, 0.0, 0.0, 0),
                                       (t(999.5), t(999.4), t(999.0), me, 300 * 2**20, 0, 98, 0.1, 0.1, 2),
                                       (t(900.0), t(899.9), t(899.0), me, 200 * 2**20, 0, 40, 0.1, 0.1, 1),
                                       (0.0, 0.0, 0, 0, 0, 0, 0, 0.0, 0.0, 0)])
    slots(heartbeat.path(path, 1, 1), [(t(990.0), t(980.0), 0, 0, 0, 0, 0, 0.0, 0.0, 0),
                                       (t(999.0), t(999.2), t(999.0), me, 950 * 2**20, 0, 400, 0.3, 0.1, 9),
                                       (t(0.0), t(700.0), t(700.0), me, 100 * 2**20, 0, 0, 0.0, 0.0, 1),
                                       (0.0, 0.0, 0, 0, 0, 0, 0, 0.0, 0.0, 0)])
    e0, e1 = int(EpisodeId.of("w0-r0-e0")), int(EpisodeId.of("w0-r0-e1"))  # as the recorder writes them
    episodes(path, "w0.r0", {"event": "start", "id": e0, "time": t(21.0), "state": {}, "blobs": {}},
             {"event": "end", "id": e0, "time": t(30.0), "steps": 90, "how": "terminated"},
             {"event": "start", "id": e1, "time": t(31.0), "state": {}, "blobs": {}})
    run.add("observed", {"name": "sub0", "pid": me, "time": t(975.0), "restart": 0, "subcollector": 0, "batches": 10,
                         "first_time": t(100.0), "policy_versions": [2, 3]})
    run.add("observed", {"name": "sub1.r1", "pid": me, "time": t(970.0), "restart": 1, "subcollector": 1, "batches": 5,
                         "first_time": t(600.0), "policy_versions": [3]})
    run.add("events", {"name": "recycle", "pid": me, "time": t(490.0), "restart": 1, "subcollector": 1, "worker": 0})
    return path


def test_each_worker_gets_its_row_and_state(tmp_path):
    v = view(Reader(fabricated(tmp_path)).read(NOW))
    got = [(r["subcollector"], r["worker"], r["restart"], r["state"]) for r in v.rows]
    assert got == [(0, 0, 0, "stepping"), (0, 1, 0, "hung"), (0, 2, 0, "dead"),
                   (1, 0, 1, "stepping"), (1, 1, 1, "ready"), (1, 2, 1, "recycled")]
    w0 = v.rows[0]
    assert (w0["episode"], w0["episode_steps"], w0["episodes"], w0["rss_mb"], w0["policy_version"]) == \
        ("w0-r0-e1", 8, 1, 300.0, 3)
    assert w0["step_rate"] == round(98 / (NOW - 20.0), 2) and w0["heartbeat_age_s"] == 0.5
    assert (v.rows[1]["step_s"], v.rows[3]["drift"], v.rows[3]["recycles"], v.rows[3]["policy_version"]) == \
        (100.0, 3.0, 1, 3)
    assert [(r["global_index"], r["attention"]) for r in v.attention] == [(1, ["hung"]), (2, ["dead"]),
                                                                         (3, ["drifting", "near a budget"])]
    h = v.header
    # sync: a collector batch takes one from each subcollector (10 and 5 delivered), each 4 of its 8 frames
    assert (h["batches"], h["frames"], h["recycles"], h["running"], h["policy_version"]) == (5, 60, 1, True, 3)
    assert h["states"] == {"ready": 1, "stepping": 2, "hung": 1, "recycled": 1, "dead": 1}


def test_rates_come_from_the_refresh_before_and_a_stall_is_named(tmp_path):
    path = fabricated(tmp_path)
    reader = Reader(path)
    first = view(reader.read(NOW))
    assert first.stall is None  # sub 1's w2 is not built yet: no watchdog before every worker is
    marker(RunDir(path), "constructed", 1, 2, 900.0, os.getpid(), restart=1, seed=2, seconds=1.0)
    slots(heartbeat.path(path, 0, 0), [(990.0, 985.0, 0, 0, 0, 0, 0, 0.0, 0.0, 0),
                                       (1001.5, 1001.4, 999.0, 1, 300 * 2**20, 0, 118, 0.1, 0.1, 2),
                                       (900.0, 899.9, 0, 0, 0, 0, 40, 0.1, 0.1, 1),
                                       (0.0, 0.0, 0, 0, 0, 0, 0, 0.0, 0.0, 0)])
    second = view(reader.read(NOW + 2), first)
    assert second.rows[0]["step_rate"] == 10.0 and second.rows[5]["state"] == "ready"
    assert second.stall["silent_subcollectors"] == [0, 1]
    assert [(w["subcollector"], w["worker"]) for w in second.stall["idle_workers"]] == [(0, 1), (0, 2), (1, 1), (1, 2)]


def test_topo_top_once_as_json_filters_and_sorts(tmp_path):
    path = fabricated(tmp_path, shift=time.time() - NOW)
    result = CliRunner().invoke(main, ["top", path, "--once", "--format", "json", "--task", "0", "--sort", "state"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert [(r["subcollector"], r["worker"], r["state"]) for r in shown["rows"]] == [(0, 0, "stepping"),
                                                                                      (1, 0, "stepping")]
    assert shown["matching"] == 2 and [r["global_index"] for r in shown["attention"]] == [3]
    text = CliRunner().invoke(main, ["top", str(tmp_path), "--once", "--state", "hung", "--state", "dead"])
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()
    assert lines[1].startswith("running") and "6 workers" in lines[1]
    assert "needs attention (2):" in lines and lines[-2].split()[:7] == ["1", "0", "1", HOST, "1", "task", "1"]
    assert lines[-1].split()[7] == "dead"  # the node column: this host, outside Ray


def test_a_run_that_ended_is_read_as_ended_through_any_spelling_of_its_path(tmp_path, monkeypatch):
    """The report names its run directory absolute; ``topo top report`` from the report's parent spells it
    relative: still the same run, ended at its report's time, with the report's batches."""
    path = fabricated(tmp_path)
    report = {"ok": True, "run_dir": path, "batches": {"count": 7}}
    for folder in (path, str(tmp_path)):
        with open(os.path.join(folder, "summary.json"), "w") as f:
            json.dump(report, f)
        os.utime(os.path.join(folder, "summary.json"), (NOW + 5, NOW + 5))
    os.utime(os.path.join(path, "launch.json"), (NOW - 100, NOW - 100))
    monkeypatch.chdir(tmp_path.parent)
    for spelled in (os.path.join(tmp_path.name, "topo-run-fab"), os.path.join(tmp_path.name, "topo-run-fab", "")):
        h = view(Reader(spelled).read(NOW + 60)).header
        assert (h["running"], h["ok"], h["elapsed_s"], h["batches"]) == (False, True, 105.0, 7)


def test_a_worker_that_closes_and_exits_while_it_is_read_is_closed_not_dead(tmp_path, monkeypatch):
    """The worker writes 'closed', then exits, after top read the markers and before it probed the pid: the close
    is read after the probe, so a process found gone without one is dead, never one that just closed."""
    import topo.runtime.live as live

    path = fabricated(tmp_path)
    probe = live.running

    def closing(pid):  # subcollector 0's w0 and w1 (pid: this process) close and exit as they are probed
        if pid == os.getpid():
            for w in (0, 1):
                marker(RunDir(path), "closed", 0, w, 999.0, pid, seconds=0.1)
            return False
        return probe(pid)

    monkeypatch.setattr(live, "running", closing)
    v = view(Reader(path).read(NOW))
    assert [(r["worker"], r["state"]) for r in v.rows[:3]] == [(0, "closed"), (1, "closed"), (2, "dead")]


def test_a_worker_that_starts_while_it_is_read_is_not_dead(tmp_path, monkeypatch):
    """A worker writes 'started' and 'constructed' after top read the markers and before it read them again (after
    the probe): its pid was never probed, so it is not dead (the 64-worker ``topo top`` test, loaded, saw two
    workers 'starting', 'dead', 'ready' so). A worker probed and found gone without a close still is."""
    import topo.runtime.live as live

    path = str(tmp_path / "topo-run-fab")
    os.makedirs(path)
    with open(os.path.join(path, "launch.json"), "w") as f:
        json.dump({"plan": {**PLAN, "subcollectors": PLAN["subcollectors"][:1]}}, f)
    run, me, gone = RunDir(path), os.getpid(), dead_pid()
    for w, pid in ((0, me), (1, gone)):
        marker(run, "started", 0, w, 10.0, pid)
        marker(run, "constructed", 0, w, 20.0, pid, seed=w, seconds=10.0)
    probe = live.running

    def starting(pid):  # worker 2 (a live process: this one's parent) starts and builds its env as w0 is probed
        if pid == me and not [m for m in run.read_all("markers") if m["worker"]["index"] == 2]:
            marker(run, "started", 0, 2, 999.0, os.getppid())
            marker(run, "constructed", 0, 2, 999.5, os.getppid(), seed=2, seconds=0.5)
        return probe(pid)

    monkeypatch.setattr(live, "running", starting)
    v = view(Reader(path).read(NOW))
    assert [(r["worker"], r["state"]) for r in v.rows] == [(0, "ready"), (1, "dead"), (2, "ready")]


def test_a_worker_killed_by_a_restart_recorded_while_it_is_read_is_restarting_not_dead(tmp_path, monkeypatch):
    """Subcollector 0's restart is recorded, then its workers killed, after top read the restarts and before it
    probed the pids (the 64-worker ``topo top`` test saw a sibling of the hung worker 'dead' so): the restarts are
    read again after the probe, and the subcollector is shown restarting, none of its workers dead."""
    import topo.runtime.live as live

    path = fabricated(tmp_path)
    probe = live.running

    def restarted(pid):  # subcollector 0 (w0, w1: this process) restarted as its workers are probed
        if pid == os.getpid() and not any(e["name"] == "restart" for e in RunDir(path).read_all("events")):
            RunDir(path).add("events", {"name": "restart", "pid": pid, "time": 999.0, "restart": 1, "subcollector": 0,
                                        "worker": 1})
        return False if pid == os.getpid() else probe(pid)

    monkeypatch.setattr(live, "running", restarted)
    v = view(Reader(path).read(NOW))
    assert [(r["worker"], r["restart"], r["state"]) for r in v.rows[:3]] == [
        (0, 1, "restarting"), (1, 1, "restarting"), (2, 1, "restarting")]


def test_a_ray_nodes_workers_are_judged_by_their_pulled_records_not_by_their_pids(tmp_path):
    """A Ray node's records reach the run directory every few seconds (placement.run_dir: per_node): a worker that
    closed and exited is not yet closed here. Its pid tells nothing; its node's actor names a dead worker."""
    path = fabricated(tmp_path)
    for run_dir, state in (("per_node", "ready"), ("shared", "dead")):  # shared: written here as it happens
        with open(os.path.join(path, "launch.json"), "w") as f:
            json.dump({"plan": {**PLAN, "placement": {"engine": "ray", "run_dir": run_dir}}}, f)
        v = view(Reader(path).read(NOW))
        assert (v.rows[2]["worker"], v.rows[2]["state"]) == (2, state)  # its pid is gone, no close here yet


def test_topo_top_names_a_missing_run(tmp_path):
    result = CliRunner().invoke(main, ["top", str(tmp_path), "--once"])
    assert result.exit_code == 2 and "is not a topo run directory" in result.output


def test_the_trace_of_fabricated_records_holds_each_phase_as_chrome_trace_events(tmp_path):
    path = fabricated(tmp_path)
    run = RunDir(path)
    marker(run, "closed", 0, 0, 1010.0, os.getpid(), seconds=2.0)
    run.add("events", {"name": "stall", "pid": 1, "time": 990.0, "restart": 0, "seconds": 25.0, "timeout": 20})
    with open(os.path.join(path, "episodes", "versions.sub0.r0.jsonl"), "w") as f:
        f.write('{"batch": 1, "time": 100.0, "pairs": []}\n{"batch": 2, "time": 101.5, "pairs": []}\n')
    os.makedirs(os.path.join(path, "eval"))
    with open(os.path.join(path, "eval", "round-001.json"), "w") as f:
        json.dump({"round": 1, "seconds": 4.0, "success_rate": 0.5}, f)
    os.utime(os.path.join(path, "launch.json"), (0.0, 0.0))  # the launch at t0 = 0: ts are the times in us
    os.utime(os.path.join(path, "eval", "round-001.json"), (1020.0, 1020.0))
    out = tmp_path / "trace.json"
    result = CliRunner().invoke(main, ["runs", "trace", path, "-o", str(out)])
    assert result.exit_code == 0, result.output
    found = json.loads(out.read_text())["traceEvents"]
    assert all({"ph", "name", "pid", "tid"} <= set(e) for e in found)
    assert all(isinstance(e["ts"], int) and isinstance(e["dur"], int) for e in found if e["ph"] == "X")
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in found if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[(1, 2)] == "w1 (row 1, task 1)" and names[(0, 1)] == "evaluation"
    processes = {e["pid"]: e["args"]["name"] for e in found if e["ph"] == "M" and e["name"] == "process_name"}
    assert processes == {0: "trainer", 1: "subcollector 0", 2: "subcollector 1"}
    spans = {(e["name"], e["pid"], e["tid"], e["args"].get("restart")): (e["ts"], e["dur"]) for e in found
             if e["ph"] == "X"}
    assert spans[("build", 1, 1, 0)] == (10_000_000, 10_000_000)
    assert spans[("build", 2, 2, 1)] == (500_000_000, 10_000_000)
    assert spans[("first reset", 1, 1, 0)] == (20_000_000, 1_000_000)  # built at 20, its first episode at 21
    assert spans[("close", 1, 1, 0)] == (1_008_000_000, 2_000_000)
    assert spans[("batch 2", 1, 0, 0)] == (100_000_000, 1_500_000)
    assert spans[("evaluation round 1", 0, 1, None)] == (1_016_000_000, 4_000_000)
    episodes = sorted((e["name"], e["ts"], e["dur"]) for e in found if e["ph"] == "X" and e["name"].startswith("w"))
    assert episodes == [("w0-r0-e0", 21_000_000, 9_000_000), ("w0-r0-e1", 31_000_000, 0)]
    (recycle,) = [e for e in found if e["ph"] == "i" and e["name"].startswith("recycle")]
    assert (recycle["pid"], recycle["ts"], recycle["name"]) == (2, 490_000_000, "recycle 1 of subcollector 1: ")
    (stall,) = [e for e in found if e["ph"] == "i" and e["name"].startswith("stall")]
    assert (stall["pid"], stall["s"], stall["name"]) == (0, "g", "stall: no batch for 25.0s")
    assert [e["name"] for e in found if e["ph"] == "X" and e["name"].startswith("recycle")] == ["recycle 1"]


def test_topo_top_ends_when_the_run_directory_goes(tmp_path, monkeypatch):
    import shutil

    import topo.runs.top

    class Gone(Reader):
        def read(self, now=None):
            shutil.rmtree(self.run.path)  # a run without --report removes its directory as it ends
            return super().read(now)

    monkeypatch.setattr(topo.runs.top, "Reader", Gone)
    path = fabricated(tmp_path)
    result = CliRunner().invoke(main, ["top", path])
    assert result.exit_code == 0 and result.output == f"run {path} ended: its directory was removed (a run " \
        "without --report keeps none)\n"
