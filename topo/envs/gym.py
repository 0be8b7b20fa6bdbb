"""``gym``: a gymnasium id through torchrl's GymEnv, built from the plan's ``env`` dict as is."""
from __future__ import annotations


def build(env: dict, **render):
    """``GymEnv(**env)``, e.g. ``{"env_name": "HalfCheetah-v5"}``; the render device settings are not used."""
    from torchrl.envs import GymEnv

    return GymEnv(**env)
