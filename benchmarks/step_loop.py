"""The step loop shaped like production: sync (a policy copy per subcollector) against async (one server, no
barrier), each beside its ideal.

    python benchmarks/step_loop.py                     # 1 x 16 and 2 x 8, forward 0 / half a step / a step
    python benchmarks/step_loop.py --seconds 10 --topologies 1x16

The env has LIBERO's observation layout (two 256 x 256 x 3 uint8 cameras, a 9-float state) and waits
(``time.sleep``) what real LIBERO takes on this machine: a step of 97 ms +- 4 (p50 97, p99 107), a reset
of 200 ms, episodes ending on success after 20-60 steps; so the benchmark measures topo's and torchrl's data
plane, not this machine's two cores. The policy reads the camera and the state and waits a set time per
batch, as a GPU VLA's forward would (0 ms, half a step, one step).

Each case is one ``topo.collector`` run of a plan compiled from a toy spec whose rows are pointed at this
env (``--case``, a fresh process each; the rows keep every topo guarantee). After two warm-up batches it
counts frames for ``--seconds``. The ideal beside each case: every env stepping at its own pace (step,
reset, one forward per step), no barrier: ``workers * L / (reset + L * (step + forward))``, L the mean
episode length. Beside it, the served ideal: one server runs one batch at a time, so a request that arrives
while a batch is in its forward waits for the rest of it (half a forward on average) before its own:
``workers * L / (reset + L * (step + 1.5 * forward))``. Results: ``benchmarks/results/step_loop.json``.

    python benchmarks/step_loop.py --libero            # real LIBERO 1 x 8 with TinyVLA, sync then async

``--libero``: the same measure on real LIBERO (examples/libero_cpu.yaml's kwargs, 1 x 8, TinyVLA): this
machine's two cores are the limit there, so it shows what async costs or gains on a saturated CPU (no ideal).
Results: ``benchmarks/results/step_loop_libero.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STEP_MS, STEP_SD_MS, RESET_MS, LENGTHS = 97.0, 4.0, 200.0, (20, 60)
FORWARDS_MS = (0.0, STEP_MS / 2, STEP_MS)
TOPOLOGIES = ((1, 16), (2, 8))
MODES = ("sync", "async")
STEPS_PER_BATCH = 4  # frames per batch: every worker's steps x this


# -- in the env workers and the policy's process (module level: spawned processes import them) ------------

def build(env: dict, **render):
    """The builder the plan rows are pointed at: a :class:`SleepyEnv` (its timing from ``env``)."""
    return SleepyEnv(**{k: env[k] for k in ("step_ms", "step_sd_ms", "reset_ms", "lengths", "instruction") if k in env})


def _env_class():
    import torch
    from tensordict import TensorDict
    from torchrl.data import Bounded, Categorical, Composite, NonTensor, Unbounded
    from torchrl.envs import EnvBase

    class Sleepy(EnvBase):
        """LIBERO's observation layout; steps, resets and episode lengths as waits drawn like LIBERO's."""

        def __init__(self, step_ms=STEP_MS, step_sd_ms=STEP_SD_MS, reset_ms=RESET_MS, lengths=LENGTHS,
                     instruction="pick up the black bowl"):
            super().__init__()
            self.step_s, self.sd_s, self.reset_s, self.lengths = step_ms / 1e3, step_sd_ms / 1e3, reset_ms / 1e3, lengths
            self.instruction, self.rng, self.t, self.length = instruction, random.Random(0), 0, lengths[0]
            image = Unbounded(shape=(3, 256, 256), dtype=torch.uint8)
            self.observation_spec = Composite(observation=Composite(image=image, wrist_image=image.clone(),
                                                                    state=Unbounded(shape=(9,))),
                                              language_instruction=NonTensor(shape=(), example_data=instruction))
            self.action_spec = Bounded(-1.0, 1.0, shape=(7,))
            self.reward_spec = Unbounded(shape=(1,))
            self.done_spec = Composite(done=Categorical(2, shape=(1,), dtype=torch.bool),
                                       terminated=Categorical(2, shape=(1,), dtype=torch.bool),
                                       truncated=Categorical(2, shape=(1,), dtype=torch.bool))
            self._image = torch.zeros(3, 256, 256, dtype=torch.uint8)

        def _observation(self, done: bool) -> TensorDict:
            flag = torch.tensor([done])
            return TensorDict({"observation": {"image": self._image.clone(), "wrist_image": self._image.clone(),
                                               "state": torch.full((9,), float(self.t))},
                               "language_instruction": self.instruction, "reward": torch.zeros(1),
                               "done": flag, "terminated": flag, "truncated": torch.tensor([False])})

        def _reset(self, tensordict=None, **kwargs):
            time.sleep(self.reset_s)
            self.t, self.length = 0, self.rng.randint(*self.lengths)
            return self._observation(False).exclude("reward")

        def _step(self, tensordict):
            time.sleep(max(0.0, self.rng.gauss(self.step_s, self.sd_s)))
            self.t += 1
            return self._observation(self.t >= self.length)

        def _set_seed(self, seed):
            self.rng = random.Random(seed)

    return Sleepy


def SleepyEnv(**kwargs):  # noqa: N802 - a class built on first use (torch imported in the worker only)
    return _env_class()(**kwargs)


def make_policy(forward_ms: float = 0.0):
    """A policy reading the camera and the state, waiting ``forward_ms`` per batch (a GPU VLA's forward)."""
    import torch
    from tensordict.nn import TensorDictModuleBase

    class Timed(TensorDictModuleBase):
        in_keys = [("observation", "image"), ("observation", "state")]
        out_keys = ["action"]

        def forward(self, td):
            if forward_ms:
                time.sleep(forward_ms / 1e3)
            td.set("action", torch.zeros(*td.batch_size, 7))
            return td

    return Timed()


# -- the cases -----------------------------------------------------------------------------------------

def plan_of(mode: str, subcollectors: int, workers: int, forward_ms: float) -> dict:
    """A toy plan of this shape, each row pointed at :func:`build` with LIBERO-like timing."""
    n = subcollectors * workers
    spec = {"version": 1, "name": f"step-loop-{mode}-{subcollectors}x{workers}",
            "env": {"backend": "toy", "kwargs": {"image_shape": [3, 256, 256], "state_dim": 9, "action_dim": 7}},
            "topology": {"subcollectors": subcollectors, "workers_per_subcollector": workers},
            "assignment": {"seeds": {"base": 0}},
            "collector": {"frames_per_batch": n * STEPS_PER_BATCH, **({"mode": "async"} if mode == "async" else {})},
            "launch": {"startup_timeout": 600},
            "policy": {"factory": "step_loop:make_policy", "kwargs": {"forward_ms": forward_ms}}}
    plan = _compile(spec)
    timing = {"step_ms": STEP_MS, "step_sd_ms": STEP_SD_MS, "reset_ms": RESET_MS, "lengths": list(LENGTHS)}
    for sub in plan["subcollectors"]:
        for row in sub["workers"]:
            row["kwargs"]["builder"] = plan["env"]["builder"] = "step_loop:build"
            row["kwargs"]["env"].update(timing)
    plan.pop("digest", None)
    return plan


def _compile(spec: dict) -> dict:
    import tempfile

    import yaml

    import topo

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(spec, f)
    try:
        return topo.compile_spec(f.name)
    finally:
        os.unlink(f.name)


def ideal(workers: int, forward_ms: float, served: bool = False) -> float:
    """Frames/s with no barrier: each env's episode of mean length L costs a reset and L steps with a forward
    (``served``: and half a forward's wait for the batch the one server is running when the request arrives)."""
    length = sum(LENGTHS) / 2
    wait = 1.5 * forward_ms if served else forward_ms
    return workers * length / (RESET_MS / 1e3 + length * (STEP_MS + wait) / 1e3)


def libero_plan(mode: str, workers: int = 8) -> dict:
    """examples/libero_cpu.yaml's env and policy as 1 x ``workers``, in ``mode``."""
    import yaml

    with open(os.path.join(HERE, "..", "examples", "libero_cpu.yaml")) as f:
        spec = yaml.safe_load(f)
    spec["name"] = f"step-loop-libero-{mode}-1x{workers}"
    spec["topology"] = {"subcollectors": 1, "workers_per_subcollector": workers}
    spec["assignment"]["tasks"] = f"0-{workers // 2 - 1}"
    spec["collector"] = {"frames_per_batch": workers * STEPS_PER_BATCH, **({"mode": "async"} if mode == "async" else {})}
    return _compile(spec)


def run_case(mode: str, subcollectors: int, workers: int, forward_ms: float, seconds: float,
             libero: bool = False) -> dict:
    """One case in this process: frames/s over ``seconds`` after two warm-up batches."""
    import topo

    plan = libero_plan(mode, workers) if libero else plan_of(mode, subcollectors, workers, forward_ms)
    started = time.monotonic()
    with topo.collector(plan, allow_edited=True, progress=False) as run:
        ready = time.monotonic() - started
        frames, t0 = 0, None
        for i, batch in enumerate(run.collector):
            if i == 1:
                t0 = time.monotonic()
            elif i > 1:
                frames += batch.numel()
                if time.monotonic() - t0 >= seconds:
                    break
        took = time.monotonic() - t0
    built = run.report.data["constructions"]["by_role"]
    out = {"mode": mode, "topology": f"{subcollectors}x{workers}", "forward_ms": None if libero else forward_ms,
           "frames": frames, "seconds": round(took, 2), "frames_per_s": round(frames / took, 1),
           "ready_s": round(ready, 1), "constructions": built}
    if not libero:
        best, served = ideal(subcollectors * workers, forward_ms), ideal(subcollectors * workers, forward_ms, True)
        out.update(ideal_frames_per_s=round(best, 1), of_ideal=round(frames / took / best, 3),
                   served_ideal_frames_per_s=round(served, 1), of_served_ideal=round(frames / took / served, 3))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--topologies", default="1x16,2x8")
    parser.add_argument("--case", help="mode:CxW:forward_ms (one case, JSON on stdout)")
    parser.add_argument("--libero", action="store_true", help="real LIBERO 1 x 8 with TinyVLA, sync and async")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.case:
        mode, shape, forward = args.case.split(":")
        c, w = map(int, shape.split("x"))
        print(json.dumps(run_case(mode, c, w, float(forward), args.seconds, args.libero)), flush=True)
        return
    args.out = args.out or os.path.join(HERE, "results", "step_loop_libero.json" if args.libero else "step_loop.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]), "MUJOCO_GL": "egl"}
    results = []
    for shape in ["1x8"] if args.libero else args.topologies.split(","):
        for forward in [0.0] if args.libero else FORWARDS_MS:
            for mode in MODES:  # side by side: the two modes of one case one after the other
                done = subprocess.run([sys.executable, __file__, "--case", f"{mode}:{shape}:{forward}", "--seconds",
                                       str(args.seconds)] + (["--libero"] if args.libero else []), env=env,
                                      capture_output=True, text=True)
                line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
                result = json.loads(line[-1]) if done.returncode == 0 and line else \
                    {"mode": mode, "topology": shape, "forward_ms": forward, "error": done.stderr[-2000:]}
                results.append(result)
                print(json.dumps(result), flush=True)
    pairs = {}
    for r in results:
        pairs.setdefault((r["topology"], r["forward_ms"]), {})[r["mode"]] = r
    ratios = [{"topology": t, "forward_ms": f, "async_over_sync": round(p["async"]["frames_per_s"] /
                                                                        p["sync"]["frames_per_s"], 2),
               **{f"{m}_{k}": p[m][k] for m in MODES for k in ("of_ideal", "of_served_ideal") if k in p[m]}}
              for (t, f), p in pairs.items() if "frames_per_s" in p.get("async", {}) and "frames_per_s" in p.get("sync", {})]
    env_of = {"libero": "examples/libero_cpu.yaml's kwargs, 1 x 8, TinyVLA"} if args.libero else {
        "step_ms": STEP_MS, "step_sd_ms": STEP_SD_MS, "reset_ms": RESET_MS, "episode_lengths": list(LENGTHS),
        "cameras": "2 x 3x256x256 uint8", "state": 9}
    out = {"what": __doc__.split("\n\n")[0].strip(), "env": env_of,
           "seconds_per_case": args.seconds, "host": os.uname().nodename, "cpus": os.cpu_count(),
           "load_average_at_end": os.getloadavg(),  # a figure taken on a host busy with other work is not the data plane's
           "results": results, "ratios": ratios}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()
