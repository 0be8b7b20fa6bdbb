"""One worker built as topo builds it, measured in a child process: the calling process builds no env.

:func:`run` (the caller's side, no torch) starts ``python -c`` on :func:`main` with a request (a plan row's
kwargs, the steps, the policy) on stdin; the child answers one JSON line after :data:`MARK`:
:func:`topo.bench.single.phases` (start + imports, construction, first reset, and ``torchrl_rss_bytes``: the
resident memory of a process with torch and torchrl.envs alone), then ``steps`` random-action steps
(``steps``: p50/p95/mean wall and mean CPU seconds of a step, the later resets, the episode length seen),
``rss_after_reset_bytes`` and ``peak_rss_bytes`` (VmRSS after the first reset, VmHWM after the steps), and
with a policy one forward at the request size on one thread (``policy``: wall and CPU seconds, median of a
few after a first call, parameter bytes, the device it ran on). Where the plan's workers are forked from a parent that
imported modules first (forkserver with preload, or fork), the worker is forked so too (``forked``): a
forked worker maps fewer of the libraries' pages than a spawned one (the toy's: 0.29 against 0.36 GB).

The data plane (``plane``): what a subcollector's ``ParallelEnv`` adds to a round per worker, beside the
worker's step: the action and the step's output through a pipe (``use_buffers=False``, worker metadata, as
topo builds it) and the parent's handling of them, serial in the subcollector. Measured with
:data:`PLANE_WORKERS` forked echo workers that hold the probed worker's own specs and answer a step with its
zeros, so they cost nothing but the plane (a toy's 16 workers: 2.1 ms a worker a round, whatever their number).
"""
from __future__ import annotations

import time

STARTED = time.time()

import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

MARK = "TOPO-ESTIMATE "
STEPS = 30
FORWARDS = 5
PLANE_WORKERS, PLANE_ROUNDS = 2, 40
TIMEOUT_S = 300.0


def run(request: dict[str, Any], timeout: float = TIMEOUT_S) -> dict[str, Any]:
    """The child's measurement of ``request``; raises :class:`~topo.errors.LaunchError` when it fails."""
    from topo.bench.single import T0_VAR
    from topo.errors import LaunchError
    from topo.runtime import child
    from topo.runtime.rundir import RUN_DIR_VAR

    env = {k: v for k, v in os.environ.items() if k != RUN_DIR_VAR}  # a worker outside any run: no records
    env[T0_VAR] = repr(time.time())
    try:
        done = subprocess.run(child.command("import topo.estimate.probe as p; p.main()"), input=json.dumps(request),
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"the estimate's probe did not finish in {timeout:.0f} s") from None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise LaunchError(f"the estimate's probe failed (exit {done.returncode}) building one worker",
                      traceback=done.stderr[-4000:] or None)


def main() -> None:
    request = json.loads(sys.stdin.read())
    print(MARK + json.dumps(measure(request)), flush=True)


def measure(request: dict[str, Any]) -> dict[str, Any]:
    """In the child: the phases, steps and memory of one worker, and one policy forward (see the module). With
    ``preload`` (the modules a forkserver imports, or a subcollector before it forks its workers), this process
    imports them, as that parent does, and the worker is a fork of it: its resident memory is a forked worker's."""
    preload = request.get("preload")
    if not preload:
        return _worker(request)
    import importlib

    from topo.runtime import gl
    from topo.runtime.heartbeat import resident
    from topo.bench.single import T0_VAR

    gl.hold()
    wall, cpu = time.perf_counter(), time.process_time()
    import torchrl.envs  # noqa: F401

    bare = resident()[0]
    for module in preload:
        importlib.import_module(module)
    parent = {"start_s": STARTED - float(os.environ[T0_VAR]) if T0_VAR in os.environ else None, "start_cpu_s": cpu,
              "imports_s": time.perf_counter() - wall, "imports_cpu_s": time.process_time() - cpu,
              "torchrl_rss_bytes": bare, "forked": True}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(read)
        try:
            answer = json.dumps(_worker(request))
        except BaseException:
            import traceback

            answer = json.dumps({"error": traceback.format_exc()})
        with os.fdopen(write, "w") as f:
            f.write(answer)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = json.loads(f.read() or '{"error": "the forked worker died"}')
    os.waitpid(pid, 0)
    if "error" in out:
        raise RuntimeError(out["error"])
    return {**out, **parent, "plane": plane(out.pop("specs"))}


def _worker(request: dict[str, Any]) -> dict[str, Any]:
    """The worker's measures; ``specs`` (its specs, pickled: for :func:`plane`) when it is a fork, else the plane."""
    from topo.bench.single import phases
    from topo.runtime.heartbeat import resident

    env, out = phases(request["kwargs"], STARTED)
    out["rss_after_reset_bytes"] = resident()[0]
    out["steps"] = steps(env, request.get("steps", STEPS))
    out["peak_rss_bytes"] = resident()[1]
    observation = env.reset()
    specs = _specs(env)
    env.close()
    if request.get("policy"):
        out["policy"] = forward(request["policy"], observation)
    out["pid"] = os.getpid()
    if request.get("preload"):
        out["specs"] = specs
    else:
        out["plane"] = plane(specs)
    return out


def _specs(env) -> str:
    """The env's specs, pickled to base64 (this probe's own processes read them: nothing from elsewhere)."""
    import base64
    import pickle

    keep = ("full_observation_spec", "full_action_spec", "full_reward_spec", "full_done_spec")
    return base64.b64encode(pickle.dumps({k: getattr(env, k).clone() for k in keep})).decode()


def plane(specs: str) -> dict[str, Any]:
    """Seconds a subcollector's round spends per worker on the data plane (see the module): wall, and the
    parent's CPU."""
    import base64
    import functools
    import pickle

    from torchrl.envs import ParallelEnv

    make = functools.partial(_echo, pickle.loads(base64.b64decode(specs)))
    echo = make()  # an echo's own step, in this process: taken off a round (the workers' steps overlap)
    td = echo.reset()
    started = time.perf_counter()
    for _ in range(PLANE_ROUNDS):
        td = echo.rand_step(td)
    step = (time.perf_counter() - started) / PLANE_ROUNDS
    env = ParallelEnv(PLANE_WORKERS, make, mp_start_method="fork", use_buffers=False, metadata_from_workers=True)
    try:
        td = env.reset()
        for i in range(PLANE_ROUNDS + 5):
            if i == 5:
                wall, cpu = time.perf_counter(), time.process_time()
            td = env.rand_step(td)
        rounds = PLANE_ROUNDS
        return {"workers": PLANE_WORKERS, "wall_s": max(0.0, (time.perf_counter() - wall) / rounds - step) / PLANE_WORKERS,
                "parent_cpu_s": (time.process_time() - cpu) / rounds / PLANE_WORKERS, "echo_step_s": step}
    finally:
        env.close()


def _echo(specs: dict):
    """An env with ``specs`` that answers every reset and step with their zeros (in a forked echo worker)."""
    from torchrl.envs import EnvBase

    class Echo(EnvBase):
        def __init__(self):
            super().__init__()
            for name, spec in specs.items():
                setattr(self, name, spec.clone())

        def _reset(self, tensordict=None, **kwargs):
            return self.full_observation_spec.zero().update(self.full_done_spec.zero())

        def _step(self, tensordict):
            return self.full_observation_spec.zero().update(self.full_done_spec.zero()).update(
                self.full_reward_spec.zero())

        def _set_seed(self, seed):
            return seed

    return Echo()


def steps(env, count: int) -> dict[str, Any]:
    """``count`` random-action steps, each timed (wall, CPU); a reset wherever an episode ends, timed apart."""
    from torchrl.envs.utils import step_mdp

    walls, cpus, resets, lengths, length = [], [], [], [], 0
    td = _timed(env.reset, resets)  # a later reset: what an episode's end costs (the first one is a phase)
    for _ in range(count):
        td = env.rand_action(td)
        wall, cpu = time.perf_counter(), time.process_time()
        td = env.step(td)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
        length += 1
        if bool(td["next", "done"].any()):
            lengths.append(length)
            length, td = 0, _timed(env.reset, resets)
        else:
            td = step_mdp(td)
    ordered = sorted(walls)
    return {"count": count, "p50_s": statistics.median(walls), "p95_s": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))],
            "mean_s": statistics.fmean(walls), "cpu_mean_s": statistics.fmean(cpus),
            "reset_s": statistics.median(r[0] for r in resets), "reset_cpu_s": statistics.median(r[1] for r in resets),
            "episode_steps": statistics.fmean(lengths) if lengths else None}


def _timed(call, into: list):
    wall, cpu = time.perf_counter(), time.process_time()
    out = call()
    into.append((time.perf_counter() - wall, time.process_time() - cpu))
    return out


def forward(policy: dict[str, Any], observation) -> dict[str, Any]:
    """One forward of the policy on ``policy["batch"]`` copies of ``observation``, on its device when this host has it."""
    import torch

    from topo.runtime.builder import import_builder

    torch.set_num_threads(1)  # as in a subcollector among many workers (torchrl's num_threads), fork or spawn alike
    module = import_builder(policy["factory"])(**policy.get("kwargs", {}))
    device = policy.get("device") or "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        device = "cpu"
    module = module.to(device)
    batch = torch.stack([observation.clone() for _ in range(policy["batch"])]).to(device)
    times = []
    with torch.no_grad():
        for _ in range(FORWARDS + 1):
            wall, cpu = time.perf_counter(), time.process_time()
            module(batch.clone())
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append((time.perf_counter() - wall, time.process_time() - cpu))
    tensors = [*module.parameters(), *module.buffers()]
    return {"batch": policy["batch"], "device": device, "first_s": times[0][0],
            "forward_s": statistics.median(t[0] for t in times[1:]),
            "forward_cpu_s": statistics.median(t[1] for t in times[1:]),
            "param_bytes": sum(t.numel() * t.element_size() for t in tensors)}
