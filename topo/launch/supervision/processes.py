"""The processes a run started: found by their environment, watched for death, torn down.

Every process a run starts (subcollectors, the policy server, env workers, the forkservers between)
inherits ``TOPO_RUN_DIR``: :func:`of_run` finds them all, orphans included, whoever their parent is
now. :class:`DeathWatch` learns of a death the moment it happens (a pidfd per process, one poll for all)
and reads how it died while the process is still a zombie. Imports neither torch nor torchrl.
"""
from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import time
from dataclasses import dataclass

import psutil

from topo.runtime.rundir import RUN_DIR_VAR

#: ``ioctl(pidfd, PIDFD_GET_INFO)`` (Linux 6.15+): a reaped process's exit status, for whoever holds its pidfd
_INFO_SIZE = 64
_PIDFD_GET_INFO = (3 << 30) | (_INFO_SIZE << 16) | (0xFF << 8) | 11
_PIDFD_INFO_EXIT = 1 << 3
EXIT_STATUS_RETRY_S = 0.05
RESOURCE_TRACKER = "multiprocessing.resource_tracker"
FORKSERVER = "multiprocessing.forkserver"


@dataclass(frozen=True)
class Death:
    """A process seen dead: when, and how (``"killed by SIGKILL"``, ``"exit code 3"``, or unknown)."""

    pid: int
    time: float
    how: str | None = None


class DeathWatch:
    """Deaths of registered pids, timestamped when they happen (pidfd), in the order they happened.

    Falls back to polling with psutil where pidfds are unavailable (Linux < 5.3, other systems).
    """

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}  # fd -> pid
        self._procs: dict[int, psutil.Process] = {}  # fallback, and pids whose pidfd failed
        self._poll = select.poll() if hasattr(select, "poll") else None
        self._early: list[Death] = []  # gone before they were watched
        self.dead: dict[int, Death] = {}

    def add(self, pid: int, alive_at: float) -> None:
        """Watch ``pid``, last known alive at ``alive_at``: the time of a death seen only now (the process
        was gone before it could be watched), so that blame still orders it before what it caused."""
        if pid in self.dead or pid in self._procs or pid in self._fds.values():
            return
        try:
            fd = os.pidfd_open(pid)  # type: ignore[attr-defined]
        except ProcessLookupError:
            self._early.append(Death(pid, alive_at, exit_status(pid)))
            return
        except (AttributeError, OSError):
            try:
                self._procs[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                self._early.append(Death(pid, alive_at, exit_status(pid)))
            return
        self._fds[fd] = pid
        if self._poll is not None:
            self._poll.register(fd, select.POLLIN)

    def wait(self, timeout: float) -> list[Death]:
        """Deaths since the last call, waiting at most ``timeout`` s for the first one."""
        found, self._early = self._early, []
        if found:
            timeout = 0
        if self._fds and self._poll is not None:
            ready = self._poll.poll(max(0, int(timeout * 1000)))
            seen = time.time()  # one poll shows deaths together, in no order: each happened before now
            for fd, _ in ready:
                pid = self._fds.pop(fd)
                found.append(Death(pid, seen, exit_status(pid, fd)))
                self._poll.unregister(fd)
                os.close(fd)
        elif timeout > 0:
            time.sleep(timeout)
        for pid, proc in list(self._procs.items()):
            if not running(proc):
                del self._procs[pid]
                found.append(Death(pid, time.time(), exit_status(pid)))
        for death in found:
            self.dead[death.pid] = death
        return found

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()


def describe_exitcode(exitcode: int | None) -> str | None:
    """multiprocessing's ``exitcode`` (negative: the signal) in the words of :func:`exit_status`."""
    if exitcode is None:
        return None
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def exit_status(pid: int, pidfd: int | None = None) -> str | None:
    """How a dead process ended: asked of its pidfd once its parent reaped it (Linux 6.15+), read from
    ``/proc/PID/stat`` while it is a zombie; None when neither can tell.

    With a pidfd, a reap in progress can hide both for a moment (its ``/proc`` entry gone, the status not
    yet on the pidfd: seen once in about 100 kills of forked workers): the two are read again, for at most
    ``EXIT_STATUS_RETRY_S``."""
    deadline = time.monotonic() + EXIT_STATUS_RETRY_S
    while True:
        status = _reaped_status(pidfd) if pidfd is not None else None
        if status is None:
            status = _zombie_status(pid)
        if status is not None or pidfd is None or time.monotonic() > deadline:
            break
        time.sleep(0.002)
    if status is None:
        return None
    if status & 0x7F:
        try:
            return f"killed by {signal.Signals(status & 0x7F).name}"
        except ValueError:
            return f"killed by signal {status & 0x7F}"
    return f"exit code {(status >> 8) & 0xFF}"


def _reaped_status(pidfd: int) -> int | None:
    buf = bytearray(struct.pack("=QQ11Ii", _PIDFD_INFO_EXIT, 0, *[0] * 11, 0))
    try:
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buf)
    except OSError:
        return None
    if not struct.unpack_from("=Q", buf)[0] & _PIDFD_INFO_EXIT:
        return None
    return struct.unpack_from("=i", buf, 60)[0]


def _zombie_status(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    if len(fields) < 50 or fields[0] != "Z":
        return None
    return int(fields[49])  # field 52, exit_code: the waitpid status


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger's trap): it runs no code until continued."""
    try:
        return psutil.Process(pid).status() in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
    except psutil.Error:
        return False


def of_run(run_dir: str, trainer: int | None = None) -> list[psutil.Process]:
    """Live processes on this machine whose environment names ``run_dir``: everything the run started.

    A process's environment as it was at exec time is read from ``/proc``, so the trainer (which sets
    the variable only while it starts processes) is never among them. With ``trainer``, neither is its
    resource tracker (multiprocessing's, started in passing: the trainer's own, it outlives the run).
    """
    out = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_DIR_VAR) != run_dir or not running(proc):
                continue
            if trainer is not None and proc.ppid() == trainer and is_resource_tracker(proc):
                continue
        except (psutil.Error, OSError):
            continue
        out.append(proc)
    return out


def is_resource_tracker(proc: psutil.Process) -> bool:
    """multiprocessing's resource tracker: exits by itself once every process that uses it is gone."""
    return _runs(proc, RESOURCE_TRACKER)


def is_forkserver(proc: psutil.Process) -> bool:
    """multiprocessing's fork server: lives as long as the process that started it, or one it forked. A process it
    forked (the run's subcollectors and env workers) has the same command line, and a server for a parent while
    that server lives (:func:`topo.launch.forkserver.end` leaves a server with children to the teardown)."""
    try:
        return _runs(proc, FORKSERVER) and not _runs(psutil.Process(proc.ppid()), FORKSERVER)
    except psutil.Error:
        return False


def _runs(proc: psutil.Process, module: str) -> bool:
    try:
        return any(module in part for part in proc.cmdline())
    except psutil.Error:
        return False


def running(proc: psutil.Process) -> bool:
    """Alive and ours: not a zombie, and not a new process that reused the pid."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def terminate(procs: list[psutil.Process], grace: float, kill_wait: float = 2.0) -> list[int]:
    """SIGTERM, wait up to ``grace`` s, then SIGKILL what is left (and wait up to ``kill_wait`` s for it);
    returns the pids that needed SIGKILL."""
    for proc in procs:
        _send(proc, psutil.Process.terminate)
    left = wait(procs, grace)
    for proc in left:
        _send(proc, psutil.Process.kill)
    wait(left, kill_wait)
    return sorted(p.pid for p in left)


def wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until none of ``procs`` runs (a zombie counts as gone), at most ``timeout`` s; returns the rest."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if running(p)]
    return left


def kill(proc: psutil.Process) -> None:
    """SIGKILL, if it still runs."""
    _send(proc, psutil.Process.kill)


def in_group(proc: psutil.Process, pgid: int) -> bool:
    try:
        return os.getpgid(proc.pid) == pgid
    except OSError:
        return False


def _send(proc: psutil.Process, how) -> None:
    if running(proc):
        try:
            how(proc)
        except psutil.NoSuchProcess:
            pass
