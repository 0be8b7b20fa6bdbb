"""A running topology seen from outside (``topo top``): one row per worker, read from the run directory alone.

:class:`Reader` reads what the run writes anyway, incrementally (a marker once, an episode file from where it
stopped): the plan (``launch.json``), the markers, each subcollector's latest batch (``observed/``), the
trainer's events (restarts, recycles, stalls: :mod:`topo.runtime.events`), the heartbeat slots of each subcollector's
current start (:mod:`topo.runtime.heartbeat`), each worker life's episodes and the evaluation rounds. :func:`view` is
pure: a :class:`Snapshot` (and the one before, for rates) to the header, the rows and what needs attention.
Imports neither torch nor numpy.
"""
from __future__ import annotations

import glob
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from topo.runtime import events, stall
from topo.runtime import heartbeat
from topo.runtime.episodes import EpisodeId, FOLDER as EPISODES
from topo.runtime.rundir import HOST, RunDir

STATES = ("starting", "ready", "stepping", "hung", "restarting", "recycled", "dead", "closed")
ATTENTION = ("hung", "dead", "drifting", "near a budget")
ACTIVE_S = 5.0  # a worker that ended a step this recently is stepping (else it waits: ready)
HUNG_S = 60.0  # a step running this long is hung, when the plan has no launch.hang_timeout
DRIFT = 2.0  # a worker's step mean over its baseline past this drifts (or past launch.recycle.max_latency_drift)
NEAR = 0.9  # a figure past this share of its health budget is near it
_BEATS = re.compile(r"^sub(\d+)\.r(\d+)\.bin$")


@dataclass
class Life:
    """What one worker life's episode file says so far (read from ``offset`` on)."""

    offset: int = 0
    ino: int = 0  # the file's inode: another one (retention rewrote it) is read again from its start
    last: int = -1  # the id of the last ended episode counted
    episodes: int = 0  # ended
    ended_steps: int = 0  # steps of the ended episodes
    open: str | None = None  # the episode in flight
    open_at: float | None = None


@dataclass
class Snapshot:
    """A run directory's records at ``at``; ``workers[(c, w, k)]``: worker ``w`` of subcollector ``c``'s start ``k``,
    its markers by name; ``beats[c]``: the slots of ``c``'s current start ``restarts[c]``."""

    run_dir: str
    plan: dict
    at: float
    launched: float
    workers: dict[tuple[int, int, int], dict[str, dict]] = field(default_factory=dict)
    observed: dict[tuple[int, int], dict] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    restarts: dict[int, int] = field(default_factory=dict)
    beats: dict[int, list[tuple]] = field(default_factory=dict)
    lives: dict[str, Life] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)  # pids of this host's workers probed and found not running
    pulled: bool = False  # the workers' records come from Ray nodes (placement.run_dir: per_node), late
    summary: dict | None = None  # the report, once the run ended
    evaluations: list[dict] = field(default_factory=list)


class Reader:
    """Reads a run directory again and again (``topo top`` refreshes), each record once."""

    def __init__(self, run_dir: str):
        self.run = RunDir(run_dir)
        launch = os.path.join(run_dir, "launch.json")
        with open(launch) as f:
            self.plan = json.load(f)["plan"]
        self.launched = os.path.getmtime(launch)
        self._workers: dict[tuple[int, int, int], dict[str, dict]] = {}
        self._lives: dict[str, Life] = {}

    def read(self, now: float | None = None) -> Snapshot:
        now = time.time() if now is None else now
        self._markers()
        placement = self.plan.get("placement") or {}
        snap = Snapshot(self.run.path, self.plan, now, self.launched, workers=self._workers,
                        pulled=placement.get("engine") == "ray" and placement.get("run_dir") == "per_node")
        for record in self.run.read_all("observed"):
            snap.observed[(record.get("subcollector"), record.get("restart", 0))] = record
        snap.events, snap.restarts = self._restarts()
        self._fill(snap, self.plan["subcollectors"])
        self._markers()  # a worker writes 'closed' before it exits: one found gone has its close read by now
        # a restart is recorded before its old workers are killed: one found gone after this read's restarts were
        # taken is explained by a restart recorded since (read again: its subcollector shown restarting, not dead)
        snap.events, restarts = self._restarts()
        moved = [sub for sub in self.plan["subcollectors"] if restarts[sub["index"]] != snap.restarts[sub["index"]]]
        if moved:
            snap.restarts = restarts
            self._fill(snap, moved)
            self._markers()
        snap.summary = _summary(self.run.path, self.launched)
        snap.evaluations = _rounds(self.run.path)
        return snap

    def _restarts(self) -> tuple[list[dict], dict[int, int]]:
        """The run's events, and each subcollector's latest restart (its markers', events' and beats files')."""
        found_events = events.read(self.run)
        restarts = {sub["index"]: 0 for sub in self.plan["subcollectors"]}
        for c, _, k in self._workers:
            restarts[c] = max(restarts.get(c, 0), k)
        for e in found_events:
            if e["name"] in ("restart", "recycle"):
                restarts[e["subcollector"]] = max(restarts.get(e["subcollector"], 0), e["restart"])
        beats = os.path.join(self.run.path, heartbeat.FOLDER)
        for name in os.listdir(beats) if os.path.isdir(beats) else []:
            found = _BEATS.match(name)
            if found:
                restarts[int(found[1])] = max(restarts.get(int(found[1]), 0), int(found[2]))
        return found_events, restarts

    def _fill(self, snap: Snapshot, subs: list[dict]) -> None:
        """The heartbeats, episode lives and running pids of ``subs``' workers, in their latest restart."""
        for sub in subs:
            c = sub["index"]
            k = snap.restarts.get(c, 0)
            slots = _slots(heartbeat.path(self.run.path, c, k))
            if slots is not None:
                snap.beats[c] = slots
            else:
                snap.beats.pop(c, None)
            for row in sub["workers"]:
                life = EpisodeId(row["global_index"], k, 0).life if "global_index" in row else None
                if life is not None:
                    snap.lives[life] = self._life(life)
                started = self._workers.get((c, row["index"], k), {}).get("started")
                if started and started.get("host", HOST) == HOST and not snap.pulled and not running(started["pid"]):
                    snap.gone.add(started["pid"])

    def _markers(self) -> None:
        for m in self.run.read_new("markers"):
            where = m.get("worker")
            if isinstance(where, dict) and "index" in where:
                key = (where.get("subcollector", -1), where["index"], m.get("restart", 0))
                self._workers.setdefault(key, {})[m["name"]] = m

    def _life(self, life: str) -> Life:
        state = self._lives.setdefault(life, Life())
        path = os.path.join(self.run.path, EPISODES, life + ".jsonl")
        try:
            st = os.stat(path)
            if st.st_ino != state.ino:
                state.ino, state.offset = st.st_ino, 0
            if st.st_size <= state.offset:
                return state
            with open(path, "rb") as f:
                f.seek(state.offset)
                data = f.read()
        except OSError:
            return state
        complete = data.rfind(b"\n") + 1  # a line being written is read next time
        state.offset += complete
        last_start = None
        for line in data[:complete].splitlines():
            if line.startswith(b'{"event": "start"'):
                last_start = line  # only the last one can be in flight: parsed once, below
            elif line.startswith(b'{"event": "end"'):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record.get("id"), int) or record["id"] <= state.last:
                    continue  # counted before the file was rewritten
                state.last = record["id"]
                state.episodes += 1
                state.ended_steps += record.get("steps") or 0
                state.open = state.open_at = last_start = None
        if last_start is not None:
            try:
                record = json.loads(last_start)
                state.open, state.open_at = str(EpisodeId.of(record["id"])), record.get("time")
            except (ValueError, KeyError):
                pass
        return state


@dataclass
class View:
    """What ``topo top`` shows: ``header`` (the run's figures), ``rows`` (one per worker), ``attention`` (the rows
    that need it, worst first), ``stall`` (the watchdog's verdict on these records, or None)."""

    header: dict[str, Any]
    rows: list[dict[str, Any]]
    attention: list[dict[str, Any]]
    stall: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"header": self.header, "attention": self.attention, "stall": self.stall, "rows": self.rows}


def view(snap: Snapshot, previous: View | None = None, hung_after: float | None = None) -> View:
    """The view of ``snap``; ``previous`` (the view of the refresh before) gives rates over the last interval,
    else over each worker's life. ``hung_after``: seconds in one step that make it hung (default: half the plan's
    ``launch.hang_timeout``, so that it shows before the monitor restarts it, else :data:`HUNG_S`)."""
    launch = snap.plan.get("launch") or {}
    hung_after = hung_after or (launch["hang_timeout"] / 2 if launch.get("hang_timeout") else HUNG_S)
    budgets = launch.get("recycle") or {}
    drift_limit = budgets.get("max_latency_drift") or DRIFT
    ended = snap.summary is not None
    before = {(r["subcollector"], r["worker"]): r for r in previous.rows} if previous else {}
    counts = _event_counts(snap.events)
    rows = []
    for sub in snap.plan["subcollectors"]:
        c, k = sub["index"], snap.restarts.get(sub["index"], 0)
        slots = snap.beats.get(c) or []
        versions = (snap.observed.get((c, k)) or {}).get("policy_versions") or []
        for row in sub["workers"]:
            w = row["index"]
            markers = snap.workers.get((c, w, k), {})
            slot = slots[w + 1] if w + 1 < len(slots) else None
            life = snap.lives.get(EpisodeId(row["global_index"], k, 0).life) if "global_index" in row else None
            out = _row(snap, row, c, w, k, markers, slot, life, hung_after, ended)
            out.update(restarts=counts.get((c, "restart"), 0), recycles=counts.get((c, "recycle"), 0),
                       policy_version=max(versions) if versions else None)
            if out["state"] in ("starting",) and k and markers.get("constructed") is None:
                last = _last_event(snap.events, c)
                out["state"] = "recycled" if last and last["name"] == "recycle" else "restarting"
            out["step_rate"] = _rate(out, before.get((c, w)), snap.at, previous.header["at"] if previous else None)
            out["attention"] = _attention(out, drift_limit, budgets)
            rows.append(out)
    attention = sorted((r for r in rows if r["attention"]), key=lambda r: (ATTENTION.index(r["attention"][0]),
                                                                          r["global_index"] or 0))
    return View(_header(snap, rows, previous), rows, attention, _stall(snap, rows))


def _row(snap: Snapshot, row: dict, c: int, w: int, k: int, markers: dict, slot: tuple | None, life: Life | None,
         hung_after: float, ended: bool) -> dict[str, Any]:
    started, constructed = markers.get("started"), markers.get("constructed")
    pid = started["pid"] if started else None
    # found gone without a close is dead, the close (written before the exit) read after the probe: never a worker
    # whose markers were read after the probe (it started meanwhile), nor a Ray node's, pulled every few seconds (its
    # actor names its dead workers; a close comes after the exit)
    begun, done, _, _, rss, _, steps, mean, baseline, resets = slot if slot else (0.0, 0.0, 0, 0, 0, 0, 0, 0.0, 0.0, 0)
    last = max(begun, done)
    if markers.get("failed") or (constructed and pid in snap.gone and not markers.get("closed") and not ended):
        state = "dead"
    elif markers.get("closed") or (ended and constructed):
        state = "closed"
    elif constructed is None:
        state = "starting"
    elif begun > done and snap.at - begun > hung_after:
        state = "hung"
    elif steps and (begun > done or snap.at - last <= ACTIVE_S):
        state = "stepping"
    else:
        state = "ready"
    in_flight = life.open if life else None
    return {"subcollector": c, "worker": w, "global_index": row.get("global_index"), "task_id": row.get("task_id"),
            "instruction": row.get("instruction"), "restart": k, "state": state, "pid": pid,
            "host": started.get("host") if started else None,
            "node": (started.get("node") or started.get("host")) if started else None, "steps": steps,
            "episode": in_flight, "episode_steps": max(steps - life.ended_steps, 0) if life and in_flight else None,
            "episodes": life.episodes if life else 0, "resets": resets,
            "heartbeat_age_s": round(snap.at - last, 3) if last else None,
            "step_s": round(snap.at - begun, 3) if begun > done else None,
            "rss_mb": round(rss / 2**20, 1) if rss else None,
            "drift": round(mean / baseline, 3) if baseline and steps >= heartbeat.BASELINE_STEPS else None,
            "built_at": constructed["time"] if constructed else None}


def _rate(row: dict, before: dict | None, now: float, then: float | None) -> float | None:
    """Env steps per second: since the refresh before (``then``, the same life), else over the life since it was built."""
    if before is not None and then is not None and before["restart"] == row["restart"] and now > then:
        return round((row["steps"] - before["steps"]) / (now - then), 2)
    if row["built_at"] and row["steps"] and now > row["built_at"]:
        return round(row["steps"] / (now - row["built_at"]), 2)
    return None


def _attention(row: dict, drift_limit: float, budgets: dict) -> list[str]:
    """Why a row needs attention, worst first (:data:`ATTENTION`)."""
    out = [row["state"]] if row["state"] in ("hung", "dead") else []
    drifting = row["drift"] is not None and row["drift"] > drift_limit
    if drifting:
        out.append("drifting")
    figures = [((row["rss_mb"] or 0) / 1024, budgets.get("max_rss_gb")), (row["resets"], budgets.get("max_episodes")),
               (0 if drifting else row["drift"] or 0, budgets.get("max_latency_drift"))]
    if any(limit and value >= NEAR * limit for value, limit in figures):
        out.append("near a budget")
    return out


def _event_counts(found: list[dict]) -> dict[tuple[int, str], int]:
    counts: dict[tuple[int, str], int] = {}
    for e in found:
        if e["name"] in ("restart", "recycle"):
            counts[(e["subcollector"], e["name"])] = counts.get((e["subcollector"], e["name"]), 0) + 1
    return counts


def _last_event(found: list[dict], c: int) -> dict | None:
    return next((e for e in reversed(found) if e["name"] in ("restart", "recycle") and e["subcollector"] == c), None)


def _header(snap: Snapshot, rows: list[dict], previous: View | None) -> dict[str, Any]:
    plan, n = snap.plan, len(snap.plan["subcollectors"])
    collector = plan.get("collector") or {}
    sync = collector.get("sync", True)
    per_batch = collector.get("frames_per_batch", 0) // n if sync else collector.get("frames_per_batch", 0)
    delivered = {sub["index"]: 0 for sub in plan["subcollectors"]}  # each subcollector's batches, all its starts
    for (c, _), r in snap.observed.items():
        delivered[c] = delivered.get(c, 0) + r.get("batches", 0)
    frames = sum(delivered.values()) * per_batch
    summary = snap.summary
    # the collector's batches: the report's count once it ended, else one from every subcollector (sync) or any one
    batches = ((summary or {}).get("batches") or {}).get("count") or \
        (min(delivered.values(), default=0) if sync else sum(delivered.values()))
    firsts = [r["first_time"] for r in snap.observed.values() if r.get("first_time")]
    if previous and snap.at > previous.header["at"]:
        fps = (frames - previous.header["frames"]) / (snap.at - previous.header["at"])
    else:
        fps = frames / (snap.at - min(firsts)) if firsts and snap.at > min(firsts) else None
    states = {s: sum(1 for r in rows if r["state"] == s) for s in STATES}
    versions = [v for r in snap.observed.values() for v in r.get("policy_versions") or []]
    last_eval = snap.evaluations[-1] if snap.evaluations else None
    return {"run_dir": snap.run_dir, "name": plan.get("name"), "at": snap.at,
            "running": summary is None, "ok": summary.get("ok") if summary else None,
            "error": (summary.get("error") or {}).get("message") if summary else None,
            "elapsed_s": round((summary["ended_at"] if summary else snap.at) - snap.launched, 1), "workers": len(rows),
            "states": {s: v for s, v in states.items() if v}, "batches": batches,
            "delivered": sum(delivered.values()), "frames": frames,
            "frames_per_s": round(fps, 1) if fps is not None else None,
            "policy_version": max(versions) if versions else None,
            "restarts": sum(1 for e in snap.events if e["name"] == "restart"),
            "recycles": sum(1 for e in snap.events if e["name"] == "recycle"),
            "evaluations": len(snap.evaluations),
            "last_eval": {k: last_eval.get(k) for k in ("round", "success_rate", "ci95", "policy_version")}
            if last_eval else None,
            "breakdown": (summary or {}).get("time_breakdown")}


def _stall(snap: Snapshot, rows: list[dict]) -> dict[str, Any] | None:
    """The watchdog's rule on these records (``launch.stall_timeout``); None without one, or once the run ended."""
    timeout = (snap.plan.get("launch") or {}).get("stall_timeout")
    built = [r["built_at"] for r in rows if r["built_at"]]
    if not timeout or snap.summary is not None or len(built) < len(rows):
        return None
    batches = {c: (snap.observed.get((c, k)) or {}).get("time") for c, k in snap.restarts.items()}
    found = stall.find(snap.plan, max(built), batches, snap.beats, timeout, snap.at)
    return None if found is None else {**found.to_dict(), "message": found.describe()}


def _slots(path: str) -> list[tuple] | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    size = heartbeat.SLOT.size
    return [heartbeat.SLOT.unpack_from(data, i) for i in range(0, len(data) - size + 1, heartbeat.STRIDE)]  # a slot's timings follow it


def running(pid: int) -> bool:
    """Whether process ``pid`` of this host is alive (or someone else's: not ours to signal)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _summary(run_dir: str, launched: float) -> dict | None:
    """The run's report, once written (``ended_at``: its file's time): in the run directory, or in the report
    directory holding it; the run it names is this one, however either path is spelled."""
    for path in (os.path.join(run_dir, "summary.json"), os.path.join(os.path.dirname(run_dir), "summary.json")):
        try:
            ended = os.path.getmtime(path)
            if ended >= launched:
                with open(path) as f:
                    found = json.load(f)
                if found.get("run_dir") is None or os.path.samefile(found["run_dir"], run_dir):
                    return {**found, "ended_at": ended}
        except (OSError, ValueError):
            continue
    return None


def _rounds(run_dir: str) -> list[dict]:
    """The evaluation rounds ended so far (``eval/round-NNN.json``), oldest first, each with its file's time."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "eval", "round-*.json"))):
        try:
            with open(path) as f:
                found = json.load(f)
            found["ended_at"] = os.path.getmtime(path)
        except (OSError, ValueError):
            continue
        found.pop("episodes_detail", None)
        out.append(found)
    return out
