"""One worker alone, in a fresh process, in phases: the costs every lower bound is built on.

    python -m topo.bench.single PLAN.json   # prints {"start_s", "imports_s", "construct_s", "reset_s"} as JSON

``start_s``: from the parent's ``Popen`` (its ``time.time()`` in ``TOPO_BENCH_T0``) to this module's first line:
the interpreter's start. ``imports_s``: torch, torchrl.envs and the builder module, what a preloading forkserver
imports once for all its workers. ``construct_s`` and ``reset_s``: what no worker can share.
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
    kwargs = plan["subcollectors"][0]["workers"][0]["kwargs"]
    from topo import gl

    gl.hold()  # as under topo launch: torchrl imported with GL held, released by make_env
    t0 = time.perf_counter()
    import torchrl.envs  # noqa: F401  (what every spawned worker imports)

    from topo.worker import import_builder, make_env

    import_builder(kwargs["builder"])
    t1 = time.perf_counter()
    env = make_env(**kwargs)
    t2 = time.perf_counter()
    env.reset()
    t3 = time.perf_counter()
    env.close()
    start = STARTED - float(os.environ[T0_VAR]) if T0_VAR in os.environ else None
    print(json.dumps({"start_s": start, "imports_s": t1 - t0, "construct_s": t2 - t1, "reset_s": t3 - t2}))


if __name__ == "__main__":
    main(sys.argv[1])
