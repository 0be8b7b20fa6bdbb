"""What the side-by-side benchmarks share: one timed training loop, and cases alternated over rounds.

Each case runs in a fresh process (``python SCRIPT --case NAME ...``, printing one JSON line), and rounds
alternate the cases (A B C A B C ...), so drift on this machine hits all alike.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the toy topology the loop benchmarks time: 2 x 4 workers, 4 tasks, TinyVLA in each subcollector
TOY_2X4 = {
    "version": 1, "name": "toy-2x4",
    "env": {"backend": "toy", "kwargs": {"success_steps": 4, "state_dim": 8}},
    "topology": {"subcollectors": 2, "workers_per_subcollector": 4},
    "assignment": {"tasks": "0-3", "instructions": {0: "push left", 1: "push right", 2: "lift", 3: "place"},
                   "groups": {"size": 1, "candidate_size": 2}, "seeds": {"base": 0}},
    "launch": {"startup_timeout": 600},
    "policy": {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}},
}


def timed(run: Any, policy: Any, batches: int, between: Callable[[], None] | None = None) -> dict[str, float]:
    """``batches`` iterations of collect, one optimizer step on ``policy`` and ``run.update_weights()`` (then
    ``between``), timed from the first batch asked: frames, wall and collection seconds, frames/s."""
    import torch

    optim = torch.optim.SGD(policy.parameters(), lr=1e-4)
    frames, collect_s = 0, 0.0
    batches_it = iter(run.collector)
    started = time.perf_counter()
    for _ in range(batches):
        t = time.perf_counter()
        batch = next(batches_it)
        collect_s += time.perf_counter() - t
        frames += batch.numel()
        loss = sum((p ** 2).sum() for p in policy.parameters())
        optim.zero_grad()
        loss.backward()
        optim.step()
        run.update_weights()
        if between is not None:
            between()
    wall = time.perf_counter() - started
    return {"frames": frames, "wall_s": round(wall, 3), "collect_s": round(collect_s, 3),
            "frames_per_s": round(frames / wall, 1)}


def alternate(script: str, cases: tuple[str, ...], rounds: int, args: list[str]) -> dict[str, list[dict]]:
    """Each case's result in each round: ``python script --case NAME *args`` in a fresh process, rounds alternating."""
    runs: dict[str, list[dict]] = {case: [] for case in cases}
    for r in range(rounds):
        for case in cases:
            done = subprocess.run([sys.executable, script, "--case", case, *args], capture_output=True, text=True,
                                  cwd=ROOT, env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
            if done.returncode != 0:
                sys.exit(f"{case} failed:\n{done.stderr[-3000:]}")
            runs[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {case}: {runs[case][-1]}", flush=True)
    return runs
