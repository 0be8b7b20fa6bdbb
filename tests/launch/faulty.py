"""User env factories for launch tests, imported by spawned env workers (put this folder on PYTHONPATH).

Each is a ``module:callable`` backend: called with the shared kwargs plus the worker's assignment.
``fault_seed`` picks the worker that misbehaves (its seed is ``base + global index``).
"""
from __future__ import annotations

import json
import os
import signal
import time


def toy(*, instruction=None, group_id_offset=0, seed=None, **_):
    from torchrl.envs import ToyVLAEnv

    return ToyVLAEnv(instruction=instruction or "toy", group_id_offset=group_id_offset, seed=seed)


def raising(*, fault_seed, seed, **kwargs):
    if seed == fault_seed:
        raise RuntimeError(f"planted failure in the worker with seed {seed}")
    return toy(seed=seed, **kwargs)


def exiting(*, fault_seed, seed, **kwargs):
    if seed == fault_seed:
        os._exit(3)
    return toy(seed=seed, **kwargs)


def hanging(*, fault_seed=None, seed, ignore_sigterm=False, **kwargs):
    """Hangs in the worker with ``fault_seed`` (every worker when None), deaf to SIGTERM if asked."""
    if fault_seed is None or seed == fault_seed:
        if ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)
    return toy(seed=seed, **kwargs)


def raising_when_restarted(*, fault_seed, stride, seed, **kwargs):
    """``toy``; but the worker planned with ``fault_seed`` raises in every restart of its subcollector
    (restart k gives it seed ``fault_seed + k * stride``, the stride being the plan's worker count)."""
    if seed > fault_seed and (seed - fault_seed) % stride == 0:
        raise RuntimeError(f"planted failure in a restarted worker (seed {seed})")
    return toy(seed=seed, **kwargs)


def hanging_step(*, fault_seed, after_steps, seed, **kwargs):
    """``toy``, whose env step never returns after ``after_steps`` steps in the worker with ``fault_seed``."""
    return _after_steps(toy(seed=seed, **kwargs), after_steps if seed == fault_seed else None,
                        lambda: time.sleep(3600))


def dying_step(*, fault_seed, after_steps, seed, **kwargs):
    """``toy``, whose worker with ``fault_seed`` SIGKILLs itself in step ``after_steps + 1`` (a restart
    reseeds it: it lives)."""
    return _after_steps(toy(seed=seed, **kwargs), after_steps if seed == fault_seed else None,
                        lambda: os.kill(os.getpid(), signal.SIGKILL))


def probed_dying_step(*, probe_dir, seed, **kwargs):
    """``dying_step``, each worker first writing where it runs to ``probe_dir/<pid>.json``: its parent, process group
    and ``TOPO_RESTART`` as its env factory sees them."""
    with open(os.path.join(probe_dir, f"{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "seed": seed,
                   "restart": os.environ.get("TOPO_RESTART")}, f)
    return dying_step(seed=seed, **kwargs)


def stopping_step(*, after_steps, seed, **kwargs):
    """``toy``, whose env step never returns after ``after_steps`` steps, in every worker: the run stalls."""
    return _after_steps(toy(seed=seed, **kwargs), after_steps, lambda: time.sleep(3600))


def slow_step(*, fault_seed, step_s, slowdown, seed, **kwargs):
    """``toy``, each step taking ``step_s`` seconds more; ``slowdown`` times that in the worker with ``fault_seed``."""
    delay = step_s * (slowdown if seed == fault_seed else 1)
    return _after_steps(toy(seed=seed, **kwargs), 0, lambda: time.sleep(delay))


def _after_steps(env, after_steps, fault):
    """``env``, calling ``fault()`` in each step past the first ``after_steps`` (None: never)."""
    if after_steps is not None:
        step, calls = env._step, [0]

        def _step(tensordict):
            calls[0] += 1
            if calls[0] > after_steps:
                fault()
            return step(tensordict)

        env._step = _step
    return env


def failing_policy(**_):
    raise RuntimeError("planted failure in the policy factory")


def plain_module(**_):
    """A policy that is not a TensorDict module (torchrl would build an env to guess its keys)."""
    import torch

    return torch.nn.Linear(8, 4)
