"""Two workers of one GRPO group (one task, init state 0, seeds 0 and 1) at their first reset, with the LIBERO
builder's ``fixtures_by_init_state`` off and on: how far apart their starts are (libero_spatial tasks 0 and 5,
64 px, agentview, soft resets).

    flock /work/heavy.lock env MUJOCO_GL=egl python benchmarks/libero_fixtures.py > benchmarks/results/libero_fixtures.json
"""
import json

import numpy as np

import topo.envs.libero as L


def start(task: int, seed: int, fair: bool) -> list:
    env = L.build({"task_suite": "libero_spatial", "task_id": task, "camera_height": 64, "camera_width": 64,
                   "max_episode_steps": 64, "init_state_mode": "fixed", "init_state_id": 0,
                   "env_kwargs": {"hard_reset": False, "camera_names": ["agentview"]},
                   "options": {"fixtures_by_init_state": fair}})
    env.set_seed(seed)
    td = env.reset()
    model, data = env._env.env.sim.model, env._env.env.sim.data
    out = [td["observation", "image"].numpy().copy(), td["observation", "state"].numpy().copy(), data.qpos.copy(),
           data.qvel.copy(), model.body_pos.copy(), model.body_quat.copy()]
    env.close()
    return out


def main() -> None:
    results = {}
    for task in (0, 5):
        for fair in (False, True):
            a, b = start(task, 0, fair), start(task, 1, fair)
            results[f"task {task}, fixtures_by_init_state={fair}"] = {
                "image_values_differ": int((a[0] != b[0]).sum()), "image_values": int(a[0].size),
                "state_max_gap": float(np.abs(a[1] - b[1]).max()), "qpos_max_gap": float(np.abs(a[2] - b[2]).max()),
                "body_pos_max_gap_m": float(np.abs(a[4] - b[4]).max()),
                "bodies_moved": int((np.abs(a[4] - b[4]).max(axis=1) > 0).sum()),
                "body_quat_max_gap": float(np.abs(a[5] - b[5]).max())}
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
