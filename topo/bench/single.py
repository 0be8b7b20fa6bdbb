"""One worker alone, in a fresh process, in phases: the costs every lower bound is built on.

    python -m topo.bench.single PLAN.json   # prints {"start_s", "imports_s", "construct_s", "reset_s", ...} as JSON

``start_s``: from the parent's ``Popen`` (its ``time.time()`` in ``TOPO_BENCH_T0``) to this module's first line:
the interpreter's start. ``imports_s``: torch, torchrl.envs and the builder module, what a preloading forkserver
imports once for all its workers (``torchrl_rss_bytes``: the process's resident memory with torch and
torchrl.envs imported, before the builder). ``construct_s`` and ``reset_s``: what no worker can share. Each phase also
in CPU seconds of the process, all its threads (``*_cpu_s``): a software renderer spreads one worker's
rendering over several cores, so a phase can take less wall time than the work it puts on the machine.
"""
from __future__ import annotations

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

T0_VAR = "TOPO_BENCH_T0"


def main(plan_path: str) -> None:
    with open(plan_path) as f:
        plan = json.load(f)
    env, out = phases(plan["subcollectors"][0]["workers"][0]["kwargs"], STARTED)
    env.close()
    print(json.dumps(out))


def phases(kwargs: dict, started: float) -> tuple[object, dict]:
    """Build and reset one worker from its row's ``kwargs`` in this process, as a spawned worker would; returns the
    env (open) and its phases (see the module), ``start_s`` from ``started``, this process's first line."""
    from topo.runtime import gl

    gl.hold()  # as under topo launch: torchrl imported with GL held, released by make_env
    marks = [(time.perf_counter(), time.process_time())]
    import torchrl.envs  # noqa: F401  (what every spawned worker imports)

    from topo.runtime.heartbeat import resident

    torchrl_rss = resident()
    from topo.runtime.builder import import_builder
    from topo.worker import make_env

    import_builder(kwargs["builder"])
    marks.append((time.perf_counter(), time.process_time()))
    env = make_env(**kwargs)
    marks.append((time.perf_counter(), time.process_time()))
    env.reset()
    marks.append((time.perf_counter(), time.process_time()))
    out = {"start_s": started - float(os.environ[T0_VAR]) if T0_VAR in os.environ else None,
           "start_cpu_s": marks[0][1],  # the process's CPU time up to here: interpreter start
           "torchrl_rss_bytes": torchrl_rss and torchrl_rss[0]}  # torch + torchrl.envs imported, no builder, no env
    for phase, (before, after) in zip(("imports", "construct", "reset"), zip(marks, marks[1:])):
        out[f"{phase}_s"], out[f"{phase}_cpu_s"] = after[0] - before[0], after[1] - before[1]
    return env, out


if __name__ == "__main__":
    main(sys.argv[1])
