"""A trainer for async mode on Ray: ``python async_ray_trainer.py SPEC REPORT_DIR BATCHES [faults]``; one JSON event
per line on stdout.

It iterates the run's collector (one actor per node, each an async run over its rows), perturbs its TinyVLA's weights
and pushes them after every batch, and reports each batch's plan rows, policy versions and worker lives (from its
episode ids), and each push's version with every node server's. With ``faults`` it SIGKILLs env worker 1 of
subcollector 1 (node_b) after the first batch, then SIGSTOPs (and leaves stopped) worker 0 of its restart once that
restart's steps arrive, and stops once every worker of subcollector 1 delivered steps of life 2 (or after BATCHES).
"""
from __future__ import annotations

import os
import signal
import sys
import time

import torch

from script_events import emit  # tests/launch, on the path


def worker_pid(run_dir: str, subcollector: int, index: int, restart: int, wait: float = 30.0) -> int:
    """The pid of an env worker of a node's run, from the records pulled into the trainer's run directory."""
    from topo.launch.ray.async_nodes import node_runs
    from topo.runtime.rundir import RunDir

    deadline = time.monotonic() + wait
    while True:
        pids = [m["pid"] for path in node_runs(run_dir) for m in RunDir(path).read_all("markers")
                if m["name"] == "started" and (m["worker"]["subcollector"], m["worker"]["index"]) == (subcollector, index)
                and m.get("restart", 0) == restart]
        if pids or time.monotonic() > deadline:
            (pid,) = pids
            return pid
        time.sleep(0.2)


def main() -> None:
    import topo
    from topo.errors import LaunchError
    from topo.runtime.episodes import EpisodeId

    spec, report_dir, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else None
    policy = topo.load(spec).make_policy()
    run = topo.collector(spec, report_dir=report_dir, progress=False, policy=policy)
    try:
        with run:
            emit(event="ready", run_dir=run.run_dir, nodes=run.collector.nodes)
            rows = [(sub["index"], row["index"]) for sub in run.plan["subcollectors"] for row in sub["workers"]]
            seen: set[tuple[int, int, int]] = set()
            stopped = None
            for i, batch in enumerate(run.collector):
                ids = batch["topo_episode"].reshape(-1).tolist()
                lives = {(*rows[w], EpisodeId.of(e).restart) for w, e in zip(batch["env_index"].reshape(-1).tolist(), ids)}
                seen |= lives
                emit(event="batch", frames=batch.numel(), lives=sorted(lives),
                     versions=sorted(set(batch["policy_version"].reshape(-1).tolist())))
                with torch.no_grad():
                    for p in policy.parameters():
                        p.add_(0.05 * torch.randn_like(p))
                version = run.update_weights()
                emit(event="pushed", version=version, servers=run.collector.server_versions)
                if mode == "faults" and i == 0:
                    pid = worker_pid(run.run_dir, 1, 1, 0)
                    os.kill(pid, signal.SIGKILL)
                    emit(event="killed", pid=pid)
                if mode == "faults" and stopped is None and (1, 0, 1) in seen:
                    stopped = worker_pid(run.run_dir, 1, 0, 1)
                    os.kill(stopped, signal.SIGSTOP)
                    emit(event="stopped", pid=stopped)
                if i + 1 == batches or mode == "faults" and {(1, 0, 2), (1, 1, 2)} <= seen:
                    break
    except LaunchError as exc:
        emit(event="launch-error", message=str(exc), subcollector=exc.subcollector)
    emit(event="after", report=run.report.data)


if __name__ == "__main__":
    main()
