"""``toy``: torchrl's ToyVLAEnv built from the plan's ``env`` dict as is."""
from __future__ import annotations


def build(env: dict, **render):
    """``ToyVLAEnv(**env)``; ``env`` holds instruction, group_id_offset, group_repeats and shared kwargs.

    The render device settings are not used: the toy env renders nothing."""
    from torchrl.envs import ToyVLAEnv

    return ToyVLAEnv(**env)
