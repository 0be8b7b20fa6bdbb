"""The watcher: a small torch-free process that ends a run's processes when its trainer dies.

The trainer starts it first, in a session of its own (no terminal signal reaches it), and tells it
``done`` once the run is torn down. If the trainer dies instead (SIGKILL, the OOM killer, a crash with
no ``finally``), the watcher sees it at once through a pidfd and terminates every process whose
environment names the run directory, orphans included: SIGTERM, then SIGKILL. It writes what it did
to ``watcher.json`` and removes a temporary run directory.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time

from topo.runtime import child, tracked
from topo.launch.supervision import processes
from topo.launch.supervision.teardown import STAGES_S

ROUNDS = 3  # scans, in case a process started while the previous round was ending others
#: run as ``BOOT RUN_DIR TRAINER_PID TEMPORARY`` (:func:`topo.runtime.child.command`: the trainer's topo, whatever the working directory)
BOOT = "from topo.launch.supervision.watcher import main; sys.exit(main(sys.argv[1:]))"


def start(run_dir: str, temporary: bool) -> subprocess.Popen:
    """Start the watcher of ``run_dir`` for this process; write ``b"done\\n"`` to its stdin at the end."""
    env = {k: v for k, v in os.environ.items() if k != processes.RUN_DIR_VAR}  # not a process of the run itself
    with open(os.path.join(run_dir, "watcher.log"), "wb") as log:
        return subprocess.Popen(child.command(BOOT, run_dir, str(os.getpid()), "1" if temporary else "0"),
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, close_fds=True)


def main(argv: list[str]) -> int:
    run_dir, trainer, temporary = argv[0], int(argv[1]), argv[2] == "1"
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _wait(trainer) == "done":
        return 0
    died = time.time()
    record = {"trainer": trainer, "trainer_died": died, **_end_run(run_dir)}
    try:
        with open(os.path.join(run_dir, "watcher.json"), "w") as f:
            json.dump(record, f)
    except OSError:
        pass
    if temporary:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


def _wait(trainer: int) -> str:
    """``"done"`` when the trainer says so, ``"died"`` when it dies first."""
    poll = select.poll()
    poll.register(sys.stdin.fileno(), select.POLLIN)
    try:
        pidfd = os.pidfd_open(trainer)
        poll.register(pidfd, select.POLLIN)
    except ProcessLookupError:
        return "died"
    except (AttributeError, OSError):
        pidfd = None
    stdin_open = True
    while True:
        for fd, _ in poll.poll(None if pidfd is not None else 500):
            if fd == pidfd:
                return "died"
            data = os.read(fd, 64)
            if b"done" in data:
                return "done"
            if not data and stdin_open:  # closed without a word: the pidfd (or polling) decides
                poll.unregister(fd)
                stdin_open = False
        if pidfd is None and not _alive(trainer):
            return "died"


def _alive(pid: int) -> bool:
    try:
        return processes.running(processes.psutil.Process(pid))
    except processes.psutil.NoSuchProcess:
        return False


def _end_run(run_dir: str) -> dict:
    terminated, killed = [], []
    for _ in range(ROUNDS):
        procs = [p for p in processes.of_run(run_dir) if not processes.is_resource_tracker(p)]
        if not procs:
            break
        terminated += [p.pid for p in procs]
        killed += processes.terminate(procs, STAGES_S["terminate"], STAGES_S["kill"])
    # a resource tracker exits by itself once its users are gone (the exit share); then it is ended
    trackers = processes.of_run(run_dir)
    killed += processes.terminate(processes.wait(trackers, STAGES_S["exit"]), STAGES_S["terminate"], STAGES_S["kill"])
    # what a tracker ended before its users (a Ray actor's, ended by Ray) left registered: unlinked here
    released = tracked.release_all(run_dir)
    return {"released": released, "terminated": sorted(set(terminated)), "killed": sorted(set(killed)),
            "left": sorted(p.pid for p in processes.of_run(run_dir))}
