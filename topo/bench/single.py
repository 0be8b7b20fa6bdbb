"""One worker alone, in a fresh process: imports, construction, first reset. The cost the limit is built on.

    python -m topo.bench.single PLAN.json   # prints {"imports_s", "construct_s", "reset_s"} as JSON
The parent adds the process start by timing the whole subprocess.
"""
from __future__ import annotations

import json
import sys
import time


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
    print(json.dumps({"imports_s": t1 - t0, "construct_s": t2 - t1, "reset_s": t3 - t2}))


if __name__ == "__main__":
    main(sys.argv[1])
