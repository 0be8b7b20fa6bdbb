"""Shared helpers of the launch tests: write specs, run ``topo launch`` (a process forked from the session's preimported
server, :mod:`tests.preimported`), find its pids."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests import preimported

HERE = Path(__file__).resolve().parent
HANG_GUARD_S = 400  # a launch that runs this long is hung (not a speed target)
# generous bounds (not speed targets): CI machines are small and shared
LAUNCH_LIMITS = {"startup_timeout": 240, "shutdown_timeout": 120}


def toy_spec(subcollectors: int = 2, workers: int = 3, **sections: Any) -> dict:
    """A toy spec: up to 3 tasks with distinct instructions, groups, seeds from 100; ``sections`` replace."""
    tasks = list(range(min(3, subcollectors * workers)))
    spec = {
        "version": 1,
        "name": f"toy-{subcollectors}x{workers}",
        "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
        "topology": {"subcollectors": subcollectors, "workers_per_subcollector": workers},
        "assignment": {
            "tasks": tasks,
            "instructions": {t: name for t, name in zip(tasks, ["push left", "push right", "lift"])},
            "groups": {"size": 1, "candidate_size": 2},
            "seeds": {"base": 100},
        },
        "launch": dict(LAUNCH_LIMITS),
    }
    spec.update(sections)
    return spec


def user_spec(factory: str, subcollectors: int = 1, workers: int = 2, **kwargs: Any) -> dict:
    return {
        "version": 1,
        "name": "user",
        "env": {"backend": factory, "kwargs": kwargs},
        "topology": {"subcollectors": subcollectors, "workers_per_subcollector": workers},
        "assignment": {"seeds": {"base": 0}},
        "launch": dict(LAUNCH_LIMITS),
    }


def write(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def subprocess_env(*paths: Path) -> dict:
    """os.environ with this folder (and ``paths``) on PYTHONPATH, so spawned workers import test factories.

    ``MUJOCO_GL=egl``, as a user who renders sets it: no parent of an env worker may open a display from it.
    """
    parts = [str(p) for p in (HERE, *paths)] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    return {**os.environ, "MUJOCO_GL": "egl", "PYTHONPATH": os.pathsep.join(parts)}


def command(*args: Any) -> list[str]:
    return [sys.executable, "-m", "topo.launch", *map(str, args)]


def launch(*args: Any, env: dict | None = None) -> subprocess.CompletedProcess:
    return guarded(command(*args), env=env or subprocess_env())


def guarded(args: list[str], env: dict, timeout: float = HANG_GUARD_S, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """:func:`tests.preimported.run` (text, captured) that, past ``timeout``, fails the test with where each process
    of the command's tree was (``py-spy dump``) and the tail of what it printed, then ends the tree."""
    proc = preimported.popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:  # it ended just now
            tree = []
        stacks = [_stack(pid) for pid in tree]
        for pid in tree:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired as exc:  # a process outside the tree holds its output open
            out, err = (_text(exc.stdout), _text(exc.stderr))
        raise AssertionError(f"hung past {timeout:g}s: {args}\n--- stdout (tail)\n{out[-3000:]}\n--- stderr (tail)\n"
                             f"{err[-3000:]}\n--- stacks\n" + "\n".join(stacks)) from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _stack(pid: int) -> str:
    try:
        return subprocess.run([str(Path(sys.executable).parent / "py-spy"), "dump", "--pid", str(pid)],
                              capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pid {pid}: no stack ({exc})"


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def summary(report: Path) -> dict:
    return json.loads((report / "summary.json").read_text())


def run_dir(report: Path) -> Path:
    (found,) = glob.glob(str(report / "topo-run-*"))
    return Path(found)


def records(report: Path, folder: str) -> list[dict]:
    return [json.loads(Path(f).read_text()) for f in glob.glob(str(run_dir(report) / folder / "*.json"))]


def wait_for(predicate, timeout: float = HANG_GUARD_S, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def started_pids(report: Path) -> set[int]:
    """Every pid the launch wrote in a marker or recorded as started, found independently of the report check."""
    pids = {r["pid"] for r in records(report, "markers")}
    path = report / "summary.json"
    if path.exists():
        pids |= set(summary(report)["processes"]["started"])
    return pids


def alive(pids: set[int], started_before: float) -> list[int]:
    """The pids still running that existed before ``started_before`` (a reused pid is someone else's)."""
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.create_time() <= started_before and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(out)


def assert_clean_launch(report, plan: dict, t_end: float) -> dict:
    """The report's claims, and the same facts read independently from the markers and by pid."""
    s = summary(report)
    n = sum(sub["num_workers"] for sub in plan["subcollectors"])
    assert s["ok"] and s["exit_code"] == 0
    assert s["plan"] == json.loads(json.dumps(plan))
    assert s["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": n}
    markers = records(report, "markers")
    built = [m for m in markers if m["name"] == "constructed"]
    sub_pids = {m["pid"] for m in markers if m["name"] == "subcollector"}
    assert len(sub_pids) == len(plan["subcollectors"])
    assert len(built) == n and len({m["pid"] for m in built}) == n  # one env per worker process
    assert not {m["pid"] for m in built} & (sub_pids | {s["processes"]["trainer_pid"]})
    rows = {(r["subcollector"], r["index"]): r for sub in plan["subcollectors"] for r in sub["workers"]}
    assert sorted((m["worker"]["subcollector"], m["worker"]["index"]) for m in built) == sorted(rows)
    for m in built:
        assert m["seed"] == rows[m["worker"]["subcollector"], m["worker"]["index"]]["seed"]
    assert s["seeds"]["mismatches"] == []
    assert s["inherited_gl"] == {"workers": 0, "libraries": []}  # MUJOCO_GL=egl, yet no display in a parent
    assert 0 < s["timings_s"]["subcollectors_up"] < s["timings_s"]["all_ready"]
    assert all(m["inherited_gl"] == [] for m in markers if m["name"] == "started")
    assert len([m for m in markers if m["name"] == "closed"]) == n
    assert s["env_closes"] == {"constructed": n, "closed": n}
    assert s["processes"]["subcollector_exit_codes"] == [0] * len(plan["subcollectors"])
    assert set(s["processes"]["subcollector_start_methods"]) == {plan["start_methods"]["subcollectors"]}
    assert s["processes"]["left_behind"] == [] and s["processes"]["alive_after"] == []
    assert alive(started_pids(report), t_end) == []
    return s


def assert_first_batch_matches(s: dict, plan: dict) -> None:
    for sub, seen in zip(plan["subcollectors"], s["first_batch"]):
        assert seen["status"] == "ok", seen
        assert seen["instructions"] == sorted({r["instruction"] for r in sub["workers"]})
        assert seen["groups"] == sorted({r["group"] for r in sub["workers"]})


def assert_every_unclosed_env_is_named(report: dict, named: dict, retired: list[tuple[int, int, int]]) -> None:
    """Every env built and not closed is in ``not_closed`` with why: the ones ``named`` (subcollector, worker,
    restart -> why) surely; any of ``retired``, ended with its start by the restart unless it closed first."""
    why = {(i["subcollector"], i["worker"], i["restart"]): i["why"] for i in report["not_closed"]}
    assert {k: why.get(k) for k in named} == named, why
    assert {k: v for k, v in why.items() if k not in named} == {k: "ended by its subcollector's restart"
                                                                for k in retired if k in why}, why
    assert report["env_closes"]["closed"] + len(why) == report["env_closes"]["constructed"]
