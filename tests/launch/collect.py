"""A collection loop for the restart tests: ``python collect.py SPEC [options]``; one JSON line per event.

It iterates ``topo.collector(SPEC)`` (random actions), does ``--do`` to a process of the run once
``--at`` batches came (``kill:worker:C:W``, ``kill:subcollector:C``, ``stop:subcollector:C``: SIGKILL or
SIGSTOP; repeated, each next ``--do`` once every restart so far collects again; with ``--faults N`` the
first one waits instead for the N restarts the spec's own faulty envs cause), and stops ``--after``
batches after every restart of the run collects again (or after ``--batches`` in all). Each batch event
lists the group blocks it holds, so a test can tell which subcollector's plan rows it came from.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from script_events import emit  # this folder: the script's own path entry


def groups(batch) -> list[int]:
    ids = batch.get("group_id", None)  # a user env may have no groups
    return [] if ids is None else sorted({int(g) // 10**6 for g in ids.flatten().tolist()})


def target(run, what: str) -> int:
    """The pid ``worker:C:W`` or ``subcollector:C`` names, in the subcollector's current start (once the
    run's monitor has read it: async batches can come before it read every record)."""
    kind, *where = what.split(":")
    c = int(where[0])
    for _ in range(100):
        pid = run.state.subcollectors[c].pid if kind == "subcollector" else run.state.workers[(c, int(where[1]))].pid
        if pid is not None:
            return pid
        time.sleep(0.05)
    raise RuntimeError(f"no pid for {what}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--report")
    parser.add_argument("--do", action="append", default=[],
                        help="kill:worker:C:W, kill:subcollector:C or stop:subcollector:C; repeat for more, in order")
    parser.add_argument("--at", type=int, default=2)
    parser.add_argument("--faults", type=int, default=0,
                        help="restarts the spec's faulty envs cause first: the first --do waits for them to collect")
    parser.add_argument("--after", type=int, default=6)
    parser.add_argument("--batches", type=int, default=10**6)
    args = parser.parse_args()

    import topo
    from topo.errors import LaunchError

    run = topo.collector(args.spec, report_dir=args.report, progress=False)
    done_at, todo = None, list(args.do)
    due = None if args.faults else args.at
    expected = args.faults  # restarts so far: the spec's own, then one per action done
    try:
        with run:
            emit(event="ready", run_dir=run.run_dir, trainer=os.getpid())
            for i, batch in enumerate(run.collector):
                restarts = run.restarts
                emit(event="batch", iteration=i, time=time.time(), groups=groups(batch),
                     restarts=[(r["subcollector"], r["outcome"]) for r in restarts])
                # every restart expected so far is collecting again
                settled = len(restarts) >= expected and all(r["outcome"] in ("collecting", "superseded")
                                                            for r in restarts)
                if todo and due is None and settled:
                    due = i
                if todo and i == due:
                    how, what = todo.pop(0).split(":", 1)
                    pid = target(run, what)
                    os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
                    emit(event="done", action=f"{how}:{what}", pid=pid, time=time.time())
                    expected, due, settled = expected + 1, None, False  # the restart it causes is not there yet
                if done_at is None and not todo and restarts and settled:
                    done_at = i
                if (done_at is not None and i >= done_at + args.after) or i + 1 >= args.batches:
                    break
    except LaunchError as err:
        emit(event="launch-error", message=str(err), subcollector=err.subcollector, worker=err.worker,
             row=err.row, formatted=err.format())
    emit(event="after", report=run.report.data if run.report else None)
    print(run.report, file=sys.stderr)


if __name__ == "__main__":
    main()
