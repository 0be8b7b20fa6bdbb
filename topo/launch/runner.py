"""The collector process: ``python -m topo.launch.runner RUN_DIR``.

The supervisor starts it in a new session, so one process-group kill reaches every subcollector and
env worker, orphaned or not. It builds the plan's collector, collects the requested batches, records
what the first batches show, shuts the collector down within the budget and reports each step as an
event in the run directory. SIGINT/SIGTERM interrupt it (once) into that same shutdown.
With ``placement.engine: ray`` it is the Ray driver: the subcollectors are actors outside its session
(:mod:`topo.launch.ray_collector`).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback

from .. import gl
from .markers import RunDir


class _Signalled(BaseException):
    """SIGINT/SIGTERM; a BaseException so that no ``except Exception`` in torchrl swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.exit_code = 128 + signum


def main(run_dir: str) -> int:
    gl.hold()  # before torch: no EGL display here, in the subcollectors or in a forkserver (topo.gl)
    run = RunDir(run_dir)
    with open(os.path.join(run_dir, "launch.json")) as f:
        job = json.load(f)
    plan = job["plan"]
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()

    from .observe import observe_batch

    if (plan.get("placement") or {}).get("engine", "local") == "ray":
        from .ray_collector import make_collector, shutdown
    else:
        from .collectors import make_collector
        shutdown = _shutdown_local

    sync = plan["collector"]["sync"]
    # an async batch is one (unnamed) subcollector's: look at enough of them to see every subcollector
    observe = 1 if sync else 4 * len(plan["subcollectors"])
    collector, code = None, 0
    try:
        collector = make_collector(plan)
        run.event("ready")
        collected = 0
        for batch in collector:
            if collected < observe:
                run.event("batch", index=collected, observed=observe_batch(batch, sync))
            collected += 1
            if collected >= job["batches"]:
                break
        run.event("collected", batches=collected)
    except _Signalled as err:
        code = err.exit_code
    except Exception as err:  # reported to the supervisor, which names the culprit
        run.event("error", type=type(err).__name__, message=str(err), traceback=traceback.format_exc())
        code = 1
    finally:
        if collector is not None:
            started = time.time()
            exit_codes = shutdown(collector, job["shutdown_timeout"])
            run.event("shutdown", started=started, exit_codes=exit_codes)
    return code


def _shutdown_local(collector, timeout: float) -> list[int | None]:
    """Close the multi collector's envs and subcollector processes; their exit codes."""
    collector.shutdown(timeout=timeout, raise_on_error=False)
    return [p.exitcode for p in collector.procs]


def _interrupt(signum, frame):
    for other in (signal.SIGINT, signal.SIGTERM):
        signal.signal(other, signal.SIG_IGN)  # once: the shutdown that follows runs undisturbed
    raise _Signalled(signum)


def _exit_with_parent(ppid: int) -> None:
    """Interrupt this process if the supervisor dies (it is no longer there to tear anything down)."""
    while os.getppid() == ppid:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
