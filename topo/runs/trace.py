"""A run as a timeline (``topo runs trace RUN -o trace.json``): Chrome trace events, which Perfetto and
chrome://tracing read, from the run directory alone (torch-free).

One process per subcollector (``pid`` ``1 + c``; an eval run's ``1001 + c``) and one for the trainer (``pid`` 0),
one thread per worker (``tid`` ``1 + w``; ``tid`` 0 the subcollector itself), named by ``"M"`` metadata events.
Complete events (``"X"``, ``ts``/``dur`` in microseconds from the launch) for each worker life's startup phases
(``build``: started to constructed; ``first reset``: to its first episode's start), its episodes, its close, each
subcollector's batches (from its per-batch records) and each restart or recycle until its workers are built
again, and each evaluation round; instant events (``"i"``) for a restart's or recycle's decision, a stall, a
worker whose builder raised.
"""
from __future__ import annotations

import glob
import json
import os
from typing import Any

from topo.runtime import events
from topo.runtime.episodes import FOLDER as EPISODES, Episodes
from topo.runtime.rundir import RunDir

TRAINER = 0
EVAL_PIDS = 1001  # an eval run's subcollector c is process EVAL_PIDS + c


def trace(run_dir: str) -> dict[str, Any]:
    """The Chrome trace of the run in ``run_dir`` (its eval run's workers and episodes too)."""
    t0 = os.path.getmtime(os.path.join(run_dir, "launch.json"))
    out: list[dict] = [_meta("process_name", TRAINER, 0, "trainer"), _meta("thread_name", TRAINER, 0, "events")]
    us = lambda t: round((t - t0) * 1e6)  # noqa: E731
    evaluations = sorted(glob.glob(os.path.join(run_dir, "eval", "collector", "topo-run-*")))
    for path, base in [(run_dir, 1), *((p, EVAL_PIDS) for p in evaluations)]:
        out += _workers(path, base, us, "eval " if base == EVAL_PIDS else "")
    for e in events.read(RunDir(run_dir)):
        at = e.get("decided_at", e["time"])
        if e["name"] in ("restart", "recycle"):
            why = e.get("cause") or e.get("breach") or ""
            out.append(_instant(f"{e['name']} {e['restart']} of subcollector {e['subcollector']}: {why}",
                                1 + e["subcollector"], 0, us(at), e))
        elif e["name"] == "stall":
            out.append({**_instant(f"stall: no batch for {e['seconds']:.1f}s", TRAINER, 0, us(at), e), "s": "g"})
    out += _restarts(run_dir, us)
    out += _rounds(run_dir, us)
    return {"traceEvents": out, "displayTimeUnit": "ms", "otherData": {"run_dir": run_dir, "t0": t0}}


def write(run_dir: str, path: str) -> int:
    """Write the trace of ``run_dir`` to ``path`` (``-``: stdout); the number of events."""
    found = trace(run_dir)
    text = json.dumps(found)
    if path == "-":
        print(text)
    else:
        with open(path, "w") as f:
            f.write(text)
    return len(found["traceEvents"])


def _workers(run_dir: str, base: int, us, prefix: str) -> list[dict]:
    """Names, startup phases, closes and batches of one run directory's subcollectors and workers, and episodes."""
    try:
        with open(os.path.join(run_dir, "launch.json")) as f:
            plan = json.load(f)["plan"]
    except (OSError, ValueError, KeyError):
        return []
    out = []
    for sub in plan["subcollectors"]:
        pid = base + sub["index"]
        out += [_meta("process_name", pid, 0, f"{prefix}subcollector {sub['index']}"),
                _meta("thread_name", pid, 0, "batches")]
        for row in sub["workers"]:
            name = f"w{row['index']} (row {row.get('global_index')}, task {row.get('task_id')})"
            out.append(_meta("thread_name", pid, 1 + row["index"], name))
    lives: dict[tuple[int, int, int], dict[str, dict]] = {}
    for m in RunDir(run_dir).read_all("markers"):
        where = m.get("worker")
        if isinstance(where, dict) and "index" in where:
            lives.setdefault((where.get("subcollector", -1), where["index"], m.get("restart", 0)), {})[m["name"]] = m
    firsts = _first_episodes(run_dir)
    for (c, w, k), markers in sorted(lives.items()):
        pid, tid, args = base + c, 1 + w, {"restart": k, "pid": (markers.get("started") or {}).get("pid")}
        started, built = markers.get("started"), markers.get("constructed")
        if started and built:
            out.append(_complete("build", pid, tid, us(started["time"]), us(built["time"]), args))
        gi = (built or started or {}).get("worker", {}).get("global_index")
        first = firsts.get((gi, k))
        if built and first:
            out.append(_complete("first reset", pid, tid, us(built["time"]), us(first), args))
        if markers.get("failed"):
            out.append(_instant("builder raised", pid, tid, us(markers["failed"]["time"]),
                                {**args, "error": markers["failed"]["traceback"].strip().splitlines()[-1]}))
        closed = markers.get("closed")
        if closed:
            out.append(_complete("close", pid, tid, us(closed["time"] - closed.get("seconds", 0)), us(closed["time"]),
                                 args))
    out += _batches(run_dir, base, us)
    for e in Episodes(run_dir) if os.path.isdir(os.path.join(run_dir, EPISODES)) else []:
        s = e.summary()
        if e.id.eval != bool(prefix) or s["subcollector"] is None:
            continue
        end = (e.end or {}).get("time", s["started"])
        out.append(_complete(str(e.id), base + s["subcollector"], 1 + s["worker"], us(s["started"]), us(end),
                             {k: s[k] for k in ("steps", "return", "success", "ended", "task_id", "policy_versions")}))
    return out


def _first_episodes(run_dir: str) -> dict[tuple[int, int], float]:
    """(global index, restart) -> when the life's first episode started (its first reset returned)."""
    out = {}
    for path in glob.glob(os.path.join(run_dir, EPISODES, "*w*.r*.jsonl")):
        stem = os.path.basename(path)[:-len(".jsonl")]
        row, _, life = stem.rpartition("w")[2].partition(".r")
        with open(path) as f:
            line = f.readline()
        try:
            out[(int(row), int(life))] = json.loads(line)["time"]
        except (ValueError, KeyError):
            continue
    return out


def _batches(run_dir: str, base: int, us) -> list[dict]:
    """Each subcollector's batches: from the one before (or its first worker's start) to when it was out."""
    out = []
    for path in glob.glob(os.path.join(run_dir, EPISODES, "versions.sub*.r*.jsonl")):
        c, _, k = os.path.basename(path)[len("versions.sub"):-len(".jsonl")].partition(".r")
        before = None
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if before is not None:
                    out.append(_complete(f"batch {record['batch']}", base + int(c), 0, us(before), us(record["time"]),
                                         {"restart": int(k), "batch": record["batch"]}))
                before = record["time"]
    return out


def _restarts(run_dir: str, us) -> list[dict]:
    """Each restart or recycle, from its decision until its workers were all built again."""
    built: dict[tuple[int, int], float] = {}
    for m in RunDir(run_dir).read_all("markers"):
        if m["name"] == "constructed" and isinstance(m.get("worker"), dict):
            key = (m["worker"].get("subcollector"), m.get("restart", 0))
            built[key] = max(built.get(key, 0.0), m["time"])
    out = []
    for e in events.read(RunDir(run_dir)):
        ready = built.get((e.get("subcollector"), e.get("restart")))
        if e["name"] in ("restart", "recycle") and ready:
            out.append(_complete(f"{e['name']} {e['restart']}", 1 + e["subcollector"], 0, us(e.get("decided_at", e["time"])),
                                 us(ready), {"cause": e.get("cause") or e.get("breach"), "worker": e.get("worker")}))
    return out


def _rounds(run_dir: str, us) -> list[dict]:
    """Each evaluation round (``eval/round-NNN.json``): its file was written when it ended."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "eval", "round-*.json"))):
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        end = os.path.getmtime(path)
        out.append(_complete(f"evaluation round {r.get('round')}", TRAINER, 1, us(end - (r.get("seconds") or 0)),
                             us(end), {k: r.get(k) for k in ("round", "policy_version", "success_rate", "episodes")}))
    if out:
        out.insert(0, _meta("thread_name", TRAINER, 1, "evaluation"))
    return out


def _meta(kind: str, pid: int, tid: int, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _complete(name: str, pid: int, tid: int, ts: int, end: int, args: dict) -> dict:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": max(end - ts, 0), "args": args}


def _instant(name: str, pid: int, tid: int, ts: int, args: dict) -> dict:
    args = {k: v for k, v in args.items() if k not in ("name", "pid", "ppid", "host", "time")}
    return {"ph": "i", "name": name, "pid": pid, "tid": tid, "ts": ts, "s": "t", "args": args}
