"""A collection loop for the health-budget tests and benchmark: ``python recycling.py SPEC --batches N``.

It iterates ``topo.collector(SPEC)`` (random actions) for exactly N batches, one JSON line per batch
(its frames, the recycles so far, each worker's memory), then the report.
"""
from __future__ import annotations

import argparse
import sys
import time

from script_events import emit  # this folder: the script's own path entry


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spec")
    parser.add_argument("--report")
    parser.add_argument("--batches", type=int, required=True)
    args = parser.parse_args()

    import topo

    run = topo.collector(args.spec, report_dir=args.report, progress=False)
    with run:
        emit(event="ready", run_dir=run.run_dir, time=time.time())
        for i, batch in enumerate(run.collector):
            emit(event="batch", iteration=i, time=time.time(), frames=batch.numel(),
                 recycles=[(r["subcollector"], r["outcome"]) for r in run.recycles],
                 memory=[(m["subcollector"], m["worker"], m["restart"], m["rss_mb"]) for m in run.worker_memory()])
            if i + 1 >= args.batches:
                break
    emit(event="after", report=run.report.data, recycles=run.recycles)
    print(run.report, file=sys.stderr)


if __name__ == "__main__":
    main()
