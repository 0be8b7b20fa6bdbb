"""A policy whose forward takes ``delay`` seconds more: TinyVLA's (topo.policies.tinyvla), then a sleep. For tests that
need an inference-bound run: ``policy: {factory: slow_policy:make, kwargs: {delay: 0.1, ...}}``."""
from __future__ import annotations

import time

from topo.policies.tinyvla import GaussianTinyVLA


class Slow(GaussianTinyVLA):
    def __init__(self, delay: float, **kwargs):
        super().__init__(**kwargs)
        self.delay = float(delay)

    def forward(self, tensordict):
        out = super().forward(tensordict)
        time.sleep(self.delay)
        return out


def make(delay: float = 0.1, action_dim: int = 4, image_size: int = 16, state_dim: int = 8) -> Slow:
    return Slow(delay, action_dim=action_dim, image_size=image_size, state_dim=state_dim)
