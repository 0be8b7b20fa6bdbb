"""A run's digest and seeds, without processes: the digest names the batches' tensors in order (and nothing that
depends on timing); every seed derived from the plan is the same for the same plan and differs per role."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from topo.launch.digest import BatchDigest, attach
from topo.seeding import derive, row_seeds, seed_globals, trainer_seed


def batch(action: float = 0.5, traj: int = 0, text: str = "push") -> TensorDict:
    return TensorDict({"action": torch.full((2, 3), action), "next": {"reward": torch.arange(2.0).unsqueeze(-1)},
                       "topo_episode": torch.tensor([7, 8]), "collector": {"traj_ids": torch.tensor([traj, traj])},
                       "language_instruction": NonTensorStack(text, text)}, batch_size=[2])


def digest_of(*batches: TensorDict) -> str:
    d = BatchDigest()
    for b in batches:
        d.update(b)
    return d.hexdigest


def test_the_same_batches_give_the_same_digest_and_any_change_another():
    assert digest_of(batch(), batch(0.25)) == digest_of(batch(), batch(0.25))
    assert digest_of(batch(), batch(0.25)) != digest_of(batch(0.25), batch())  # the order counts
    assert digest_of(batch()) != digest_of(batch(0.5 + 1e-7))  # one bit of one action
    assert digest_of(batch()) != digest_of(batch(), batch())


def test_the_digest_leaves_out_torchrl_trajectory_ids_and_text():
    """torchrl numbers trajectories from a counter the subcollectors share, in the order they get there."""
    assert digest_of(batch(traj=0)) == digest_of(batch(traj=5))
    assert digest_of(batch(text="push")) == digest_of(batch(text="lift"))


def test_the_digest_tells_dtype_and_shape_apart():
    a = TensorDict({"x": torch.zeros(4, dtype=torch.int32)}, batch_size=[4])
    b = TensorDict({"x": torch.zeros(2, 2, dtype=torch.int32)}, batch_size=[2])
    c = TensorDict({"x": torch.zeros(4, dtype=torch.float32)}, batch_size=[4])
    assert len({digest_of(a), digest_of(b), digest_of(c)}) == 3


def test_the_report_section_counts_batches_and_their_cost():
    d = BatchDigest()
    assert d.describe() == {"sha256": d.hexdigest, "count": 0, "ms_per_batch": None}
    d.update(batch())
    section = d.describe()
    assert section["count"] == 1 and section["ms_per_batch"] >= 0 and section["sha256"] == digest_of(batch())


def test_attach_digests_what_a_torchrl_collector_yields_or_topo_ray_collector_hands_over():
    class Torchrl:
        def iterator(self):
            yield batch()
            yield batch(0.25)

        def __iter__(self):
            yield from self.iterator()

    class Ray:
        on_batch = None

    d = BatchDigest()
    collector = Torchrl()
    attach(collector, d)
    assert len(list(collector)) == 2
    assert d.hexdigest == digest_of(batch(), batch(0.25))
    ray, d = Ray(), BatchDigest()
    attach(ray, d)
    ray.on_batch(batch())
    assert d.hexdigest == digest_of(batch())


def test_derived_seeds_are_the_same_for_the_same_seeds_and_differ_per_role_and_seed():
    assert derive([100, 101], "subcollector") == derive([100, 101], "subcollector")
    roles = {derive([100, 101], role) for role in ("worker", "subcollector", "server", "trainer")}
    assert len(roles) == 4
    assert derive([100, 101], "subcollector") != derive([102, 103], "subcollector")
    assert derive([None, None], "subcollector") is None and derive([], "worker") is None
    assert 0 <= derive([2**70], "worker") < 2**64


def test_seed_globals_makes_torch_numpy_and_random_draw_the_same():
    def draws():
        return torch.randn(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    seed_globals(derive([5], "subcollector"))
    first = draws()
    seed_globals(derive([5], "subcollector"))
    assert draws() == first
    seed_globals(derive([6], "subcollector"))
    assert draws() != first


@pytest.mark.parametrize("seeds, expected", [([100, 101, 102], True), ([None, None, None], False)])
def test_the_trainer_seed_comes_from_the_plan_rows(seeds, expected):
    plan = {"subcollectors": [{"workers": [{"seed": seeds[0]}, {"seed": seeds[1]}]}, {"workers": [{"seed": seeds[2]}]}]}
    assert row_seeds(plan) == seeds
    assert (trainer_seed(plan) is not None) is expected
