"""The run's forkserver: one process that imports torch, torchrl and topo's subcollector once, and forks the run's
processes from there.

With ``start_method: {subcollectors: forkserver, workers: forkserver}`` (topo's default) a local run starts one
(:func:`start`, in the trainer's launch window, so it holds the run's environment); every subcollector is forked
from it, and each subcollector forks its env workers from it too (:func:`adopt`). A spawned subcollector imports
torch and torchrl, then its own forkserver imports them again: two imports per subcollector, where the run's
forkserver makes one per run. A process forked from it inherits the server's environment and process group, not
its requester's: each subcollector's env workers take its environment and join its process group first thing
(:func:`topo.launch.boundary.quiet_env_workers`), a restarted subcollector takes the trainer's
(:mod:`topo.launch.local.respawn`). Ended with the run (:func:`end`). Imports neither torch nor torchrl.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

GRACE_S = 2.0  # how long :func:`end` waits for the server to exit before it leaves it to the teardown
#: what a subcollector imports beyond the plan's preload (its collector loop, topo's side of it)
SUBCOLLECTOR_PRELOAD = ["torchrl.collectors", "topo.launch.subcollector", "topo.launch.local.respawn"]


def start(preload: Iterable[str]) -> str:
    """In the trainer: this process's forkserver, started now with ``preload`` imported (one this process ran
    already, another run's or the user's, is ended first: a forkserver's preload is fixed when it starts); its
    address, for :func:`adopt`."""
    from multiprocessing import forkserver

    end()
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(preload))
    forkserver.ensure_running()
    return forkserver._forkserver._forkserver_address


def adopt(address: str) -> None:
    """In a process forked from the run's forkserver: the processes it starts with ``forkserver`` are forked from
    that server too (at ``address``), rather than from a server of its own. It holds the server's liveness pipe and
    the resource tracker already (CPython hands them to every process the server forks)."""
    from multiprocessing import forkserver, resource_tracker

    server = forkserver._forkserver
    server._forkserver_address = address
    server.ensure_running = resource_tracker.ensure_running  # never a server of its own


def end(grace: float = GRACE_S) -> None:
    """Stop this process's forkserver, if it runs: its pipe closed, it exits once the processes it forked are gone
    (each holds the pipe too), reaped here within ``grace`` seconds; one still serving a process that outlived the
    run is left to the teardown, which ends it and counts that process, and is reaped by a thread whenever it exits
    (a training script running one run after another keeps no zombie of each). Either way it is forgotten: the next
    process started from here starts a new one."""
    from multiprocessing import forkserver, util

    server = forkserver._forkserver
    with server._lock:
        pid, address = server._forkserver_pid, server._forkserver_address
        if pid is None:
            return
        server._forkserver_pid = server._forkserver_address = None
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
        if address and not util.is_abstract_socket_namespace(address):
            with contextlib.suppress(OSError):
                os.unlink(address)
        deadline = time.monotonic() + grace
        with contextlib.suppress(ChildProcessError):  # reaped already (the teardown ended it)
            while os.waitpid(pid, os.WNOHANG) == (0, 0):
                if time.monotonic() >= deadline:
                    threading.Thread(target=_reap, args=(pid,), name=f"topo-reap-{pid}", daemon=True).start()
                    return
                time.sleep(0.02)


def remove_temp_dir() -> None:
    """Remove this process's multiprocessing temp directory now, as its exit would (the finalizer that
    ``get_temp_dir`` registered, run once): it holds its forkserver's socket. For a process about to be SIGKILLed,
    a Ray actor (Ray ends it so), whose directory would otherwise stay in the temp dir, one per actor and run."""
    from multiprocessing import util

    for finalizer in list(util._finalizer_registry.values()):
        if getattr(finalizer, "_callback", None) is util._remove_temp_dir:
            with contextlib.suppress(OSError):  # removed already: nothing left to do
                finalizer()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def shared(plan: dict[str, Any]) -> bool:
    """Whether a local run of ``plan`` forks its subcollectors and env workers from one forkserver."""
    return plan["start_methods"]["subcollectors"] == plan["start_methods"]["workers"] == "forkserver"


def preload(plan: dict[str, Any]) -> list[str]:
    """What the run's forkserver imports: the plan's ``launch.preload`` (nothing of it opens GL or CUDA:
    :func:`topo.compiler.plan.preload_modules`) and a subcollector's modules."""
    return list(plan["launch"].get("preload") or []) + SUBCOLLECTOR_PRELOAD


@dataclass(frozen=True)
class Requester:
    """What a process forked from the run's forkserver takes from the process that asked for it: its environment
    and, for an env worker, its process group (the subcollector's, which a restart or the teardown ends whole)."""

    environ: dict[str, str]
    group: int | None = None

    def join(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        if self.group is not None:
            try:
                os.setpgid(0, self.group)
            except OSError:  # the group is gone: its subcollector died, and this worker's pipe with it
                pass


def in_environ(environ: dict[str, str], target: Callable, **kwargs: Any) -> None:
    """A process's target, run in the environment its starter had (a forkserver's child has the server's)."""
    Requester(environ).join()
    target(**kwargs)
