"""A trainer for the async-mode tests: ``python async_trainer.py SPEC REPORT_DIR BATCHES [kill-worker]``.

It iterates the run's collector and prints one JSON event per batch (its size, the plan rows that took its
steps, whether every step carries a policy version and an episode id, the episodes they resolve to); with
``kill-worker`` it SIGKILLs env worker 1 of subcollector 1 after the first batch and reports the error.
"""
from __future__ import annotations

import os
import signal
import sys

from script_events import emit  # this folder: the script's own path entry


def main() -> None:
    import topo
    from topo.errors import LaunchError
    from topo.runtime.rundir import RunDir

    spec, report_dir, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kill = sys.argv[4:] == ["kill-worker"]
    run = topo.collector(spec, report_dir=report_dir, progress=False)
    try:
        with run:
            rows = [(sub["index"], row["index"]) for sub in run.plan["subcollectors"] for row in sub["workers"]]
            for i, batch in enumerate(run.collector):
                ids = batch["topo_episode"].reshape(-1).tolist()
                episodes = run.episodes()
                emit(event="batch", frames=batch.numel(), rows=sorted({rows[e] for e in batch["env_index"].tolist()}),
                     versions=sorted(set(batch["policy_version"].reshape(-1).tolist())),
                     episode_rows=sorted({(episodes.get(e).row["subcollector"], episodes.get(e).row["index"])
                                          for e in set(ids)}),
                     step_rows_match=all(rows[w] == (episodes.get(e).row["subcollector"], episodes.get(e).row["index"])
                                         for w, e in zip(batch["env_index"].tolist(), ids)))
                if kill and i == 0:
                    (pid,) = [m["pid"] for m in RunDir(run.run_dir).read_all("markers")
                              if m["name"] == "started" and (m["worker"]["subcollector"], m["worker"]["index"]) == (1, 1)]
                    os.kill(pid, signal.SIGKILL)
                    emit(event="killed", pid=pid)
                if i + 1 == batches:
                    break
    except LaunchError as exc:
        emit(event="launch-error", message=str(exc), subcollector=exc.subcollector, worker=exc.worker)
    emit(event="after", report=run.report.data)


if __name__ == "__main__":
    main()
