"""Policies for benchmarks/training.py: importable by the processes a run spawns (their sys.path has this folder)."""
from __future__ import annotations

import torch

from topo.policies.tinyvla import GaussianTinyVLA


class LargeTinyVLA(GaussianTinyVLA):
    """TinyVLA carrying ``extra_params`` more parameters that every weight update moves (a multi-GB VLA's
    stand-in for the cost of weight sync; they take no part in the forward pass)."""

    def __init__(self, extra_params: int, **kwargs):
        super().__init__(**kwargs)
        self.extra = torch.nn.Parameter(torch.zeros(extra_params))

    def log_prob(self, tensordict):
        return super().log_prob(tensordict) + 0.0 * self.extra[:1].sum()  # gradients reach every parameter


def large(extra_params: int, action_dim: int = 4, image_size: int = 16, state_dim: int = 8) -> LargeTinyVLA:
    return LargeTinyVLA(extra_params, action_dim=action_dim, image_size=image_size, state_dim=state_dim)
