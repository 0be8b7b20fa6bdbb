"""Two async runs one after the other in one process (``python two_async_runs.py SPEC REPORT_DIR``): per run, the
pids of the forkservers this process started while it collects and after it ended, and its children left
after it ended, one JSON event each."""
from __future__ import annotations

import os
import sys

import psutil

from script_events import emit  # this folder: the script's own path entry


def forkservers() -> list[int]:
    from topo.launch.supervision import processes

    return sorted(p.pid for p in psutil.Process().children() if processes.is_forkserver(p))


def children() -> list[int]:
    """This process's children but multiprocessing's resource tracker (it serves the process, not a run)."""
    from topo.launch.supervision import processes

    return sorted(p.pid for p in psutil.Process().children() if not processes.is_resource_tracker(p))


def main() -> None:
    import topo

    spec, report_dir = sys.argv[1], sys.argv[2]
    for n in range(2):
        run = topo.collector(spec, report_dir=os.path.join(report_dir, str(n)), progress=False)
        with run:
            for i, _ in enumerate(run.collector):
                if i == 1:
                    break
            during = forkservers()
        emit(event="run", n=n, during=during, after=forkservers(), children=children())


if __name__ == "__main__":
    main()
