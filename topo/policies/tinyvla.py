"""A small real policy for examples, tests and smoke runs: torchrl's ``TinyVLA`` with a Gaussian action.

``TinyVLA`` (a conv image encoder, a state MLP and a hashed instruction embedding; no download) reads
the VLA TensorDict schema that ``LiberoEnv`` and ``ToyVLAEnv`` emit and predicts an action chunk. This
module takes the chunk, squashed to ``[-1, 1]``, as the mean of a Gaussian of fixed ``std``: under random
exploration (a collector's default) ``action`` is a sample, otherwise the mean, so actions are a deterministic
function of the weights when asked. ``action_log_prob`` is written for a policy-gradient update, which
:meth:`GaussianTinyVLA.log_prob` recomputes under the current weights.

``chunk_size`` 1 (the default): ``action`` is one env action ``[..., action_dim]``. ``chunk_size`` N > 1: the
whole chunk, ``[..., N, action_dim]``, for torchrl's ``MultiAction`` in ``env.transforms`` to execute as N env
steps per decision (it unbinds the chunk's first dim, stops the chunk at an episode's end); ``action_log_prob``
is then the chunk's (summed over its N actions): one decision, one probability.

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
                 seed: int = 0, chunk_size: int = 1):
        super().__init__()
        from torchrl.modules.vla import TinyVLA

        with torch.random.fork_rng():
            torch.manual_seed(seed)  # every copy built with the same seed starts with the same weights
            self.vla = TinyVLA(action_dim=action_dim, chunk_size=chunk_size, hidden_dim=hidden_dim,
                               return_vla_action_container=False, inplace=False)
            self.vla(TensorDict({  # materialise the lazy layers for these shapes
                "observation": {"image": torch.zeros(1, 3, image_size, image_size, dtype=torch.uint8),
                                "state": torch.zeros(1, state_dim)},
                "language_instruction": NonTensorStack("")}, batch_size=[1]))
        self.std = float(std)
        self.chunk_size = int(chunk_size)
        self.in_keys = list(self.vla.in_keys)
        self.out_keys = ["action", "action_log_prob"]

    def mean(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The mean action, shaped like ``tensordict``'s batch plus ``[action_dim]`` (``[chunk_size, action_dim]``
        for a chunk)."""
        flat = tensordict.reshape(-1)
        chunk = torch.tanh(self.vla(flat.select(*self.in_keys))["vla_action", "chunk"])
        if self.chunk_size == 1:
            return chunk[:, 0].reshape(*tensordict.batch_size, -1)
        return chunk.reshape(*tensordict.batch_size, *chunk.shape[1:])

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
        log_prob = torch.distributions.Normal(mean, self.std).log_prob(action).sum(-1)
        return log_prob if self.chunk_size == 1 else log_prob.sum(-1)


def make(action_dim: int = 4, image_size: int = 16, state_dim: int = 8, hidden_dim: int = 64, std: float = 0.2,
         seed: int = 0, chunk_size: int = 1) -> GaussianTinyVLA:
    """The factory a spec names: ``topo.policies.tinyvla:make``."""
    return GaussianTinyVLA(action_dim, image_size, state_dim, hidden_dim, std, seed, chunk_size)
