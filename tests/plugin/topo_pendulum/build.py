"""The runtime half: imported in each env worker."""
from __future__ import annotations


def build(env: dict, **render):
    from torchrl.envs import PendulumEnv

    return PendulumEnv(td_params=PendulumEnv.gen_params(g=env["g"]), device=env.get("device"))
