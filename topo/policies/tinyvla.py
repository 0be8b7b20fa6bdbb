"""A small real policy for examples, tests and smoke runs: torchrl's ``TinyVLA`` with a Gaussian action.

``TinyVLA`` (a conv image encoder, a state MLP and a hashed instruction embedding; no download) reads
the VLA TensorDict schema that ``LiberoEnv`` and ``ToyVLAEnv`` emit and predicts an action chunk. This
module takes the first action of the chunk, squashed to ``[-1, 1]``, as the mean of a Gaussian of fixed
``std``: under random exploration (a collector's default) ``action`` is a sample, otherwise the mean,
so actions are a deterministic function of the weights when asked. ``action_log_prob`` is written for
a policy-gradient update, which :meth:`GaussianTinyVLA.log_prob` recomputes under the current weights.

Spec: ``policy: {factory: topo.policies.tinyvla:make, kwargs: {action_dim: 7, image_size: 64, state_dim: 9}}``.
"""
from __future__ import annotations

import torch
from tensordict import NonTensorStack, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs.utils import ExplorationType, exploration_type


class GaussianTinyVLA(TensorDictModuleBase):
    """TinyVLA predicting the mean of a Gaussian action (see the module docstring)."""

    def __init__(self, action_dim: int, image_size: int, state_dim: int, hidden_dim: int = 64, std: float = 0.2,
                 seed: int = 0):
        super().__init__()
        from torchrl.modules.vla import TinyVLA

        with torch.random.fork_rng():
            torch.manual_seed(seed)  # every copy built with the same seed starts with the same weights
            self.vla = TinyVLA(action_dim=action_dim, chunk_size=1, hidden_dim=hidden_dim,
                               return_vla_action_container=False, inplace=False)
            self.vla(TensorDict({  # materialise the lazy layers for these shapes
                "observation": {"image": torch.zeros(1, 3, image_size, image_size, dtype=torch.uint8),
                                "state": torch.zeros(1, state_dim)},
                "language_instruction": NonTensorStack("")}, batch_size=[1]))
        self.std = float(std)
        self.in_keys = list(self.vla.in_keys)
        self.out_keys = ["action", "action_log_prob"]

    def mean(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The mean action, shaped like ``tensordict``'s batch plus ``[action_dim]``."""
        flat = tensordict.reshape(-1)
        chunk = self.vla(flat.select(*self.in_keys))["vla_action", "chunk"]
        return torch.tanh(chunk[:, 0]).reshape(*tensordict.batch_size, -1)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        with torch.no_grad():
            mean = self.mean(tensordict)
            sampled = exploration_type() is ExplorationType.RANDOM
            action = mean + self.std * torch.randn_like(mean) if sampled else mean
            tensordict.set("action", action)
            tensordict.set("action_log_prob", self._log_prob(mean, action))
        return tensordict

    def log_prob(self, tensordict: TensorDictBase) -> torch.Tensor:
        """Log-probability of ``tensordict["action"]`` under the current weights (differentiable)."""
        return self._log_prob(self.mean(tensordict), tensordict["action"])

    def _log_prob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.distributions.Normal(mean, self.std).log_prob(action).sum(-1)


def make(action_dim: int = 4, image_size: int = 16, state_dim: int = 8, hidden_dim: int = 64, std: float = 0.2,
         seed: int = 0) -> GaussianTinyVLA:
    """The factory a spec names: ``topo.policies.tinyvla:make``."""
    return GaussianTinyVLA(action_dim, image_size, state_dim, hidden_dim, std, seed)
