"""A user env factory that grows unhealthy, for health-budget tests and ``benchmarks/recycle_memory.py``:
``toy`` whose every step sleeps ``step_ms``, and, in the worker planned with the seed named:
``leak_seed`` allocates and holds ``leak_mb`` MB per step (with ``leak_stride`` N, every seed equal to it
modulo N: the workers' plan count keeps it leaking through restarts), ``slow_seed`` sleeps ``slow_ms`` longer at each
step past its first 50 (its baseline), ``short_seed`` ends its episodes every ``episode_steps`` steps
(the others never end theirs), ``hang_seed`` never returns from its step ``hang_after + 1``. A restart or recycle
reseeds the worker: it is healthy again. ``rebuild_s``: a worker of a restarted or recycled subcollector (its
``TOPO_RESTART``) sleeps that long before its env is built, so that the rebuild lasts long enough to be watched.
"""
from __future__ import annotations

import os
import time

from faulty import toy


def unhealthy(*, seed, step_ms=2.0, leak_seed=None, leak_mb=4, leak_stride=None, slow_seed=None, slow_ms=0.2,
              short_seed=None, episode_steps=5, hang_seed=None, hang_after=0, rebuild_s=0.0, **kwargs):
    if os.environ.get("TOPO_RESTART"):
        time.sleep(rebuild_s)
    env = toy(seed=seed, **kwargs)
    step, held, steps = env._step, [], [0]
    leaks = seed == leak_seed or (leak_stride and leak_seed is not None and seed % leak_stride == leak_seed)

    def _step(tensordict):
        steps[0] += 1
        if leaks:
            held.append(b"\x01" * (leak_mb << 20))  # written: resident
        if seed == hang_seed and steps[0] > hang_after:
            time.sleep(3600)
        slower = slow_ms * max(steps[0] - 50, 0) if seed == slow_seed else 0.0
        time.sleep((step_ms + slower) / 1000)
        out = step(tensordict)
        if seed == short_seed and steps[0] % episode_steps == 0:  # same specs as the others: an episode ends
            out["done"].fill_(True)
            out["terminated"].fill_(True)
        return out

    env._step = _step
    return env
