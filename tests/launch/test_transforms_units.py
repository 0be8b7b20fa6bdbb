"""``env.transforms`` in one process: the stack as the plan names it, the worker's env under it (decisions and
env steps counted where they run), the chunked TinyVLA, and async mode's action slot checked against the stack."""
from __future__ import annotations

import pytest
import torch

from topo.backends import get_backend
from topo.errors import UsageError
from topo.launch.async_mode import slots as async_slots
from topo.policies.tinyvla import make
from topo.runtime.transforms import TransformError, build_stack, count_steps
from topo.worker import make_env

TOY = {"builder": "topo.envs.toy:build", "env": {"success_steps": 3, "success_tol": 0.5, "state_dim": 8}, "seed": 3}
CHUNK = [{"name": "MultiAction", "kwargs": {"stack_rewards": False}}, {"name": "StepCounter", "kwargs": {"max_steps": 4}}]


def built_by_tests(value: int = 1):
    from torchrl.envs.transforms import RewardScaling

    return RewardScaling(loc=0.0, scale=float(value))


def test_each_name_resolves_as_the_contract_says():
    stack = build_stack([{"name": "MultiAction.from_vla", "kwargs": {"stack_rewards": False}}, {"name": "SuccessReward"},
                         {"name": "StepCounter", "kwargs": {"max_steps": 5}},
                         {"name": f"{__name__}:built_by_tests", "kwargs": {"value": 2}}])
    assert [type(t).__name__ for t in stack] == ["MultiAction", "SuccessReward", "StepCounter", "RewardScaling"]
    assert stack[0].out_keys_inv == [("vla_action", "chunk")] and stack[2].max_steps == 5 and float(stack[3].scale) == 2.0


@pytest.mark.parametrize("item, message", [
    ({"name": "StepCounter", "kwargs": {"max_steps": 0}},
     "env.transforms[0] StepCounter: ValueError: max_steps should have a value greater or equal to one."),
    ({"name": "StepCounter", "kwargs": {"max_step": 4}}, "env.transforms[0] StepCounter: TypeError: "),
    ({"name": "NoSuchTransform"}, "env.transforms[0] NoSuchTransform: AttributeError: "),
])
def test_an_item_that_raises_is_named(item, message):
    with pytest.raises(TransformError) as found:
        build_stack([item])
    assert str(found.value).startswith(message)


def test_a_worker_env_under_multiaction_takes_a_chunk_per_decision():
    env = make_env(**TOY, transforms=CHUNK)
    base = env.base_env
    taken = []
    count_steps(base, lambda: taken.append(1))
    assert tuple(env.full_action_spec["action"].shape) == (-1, 4)  # torchrl leaves the chunk's length open
    policy = make(action_dim=4, image_size=16, state_dim=8, chunk_size=8)
    td = env.rollout(4, policy, break_when_any_done=False)
    assert td["action"].shape == (4, 8, 4) and td["action_log_prob"].shape == (4,)
    assert td["next", "step_count"].reshape(-1).tolist() == [1, 2, 3, 4]
    assert len(taken) == 32  # echo of nothing: no episode ends mid-chunk (random actions miss the target)
    env.close()


def test_an_episode_ending_mid_chunk_stops_the_chunk():
    env = make_env(**TOY, transforms=CHUNK)
    taken = []
    count_steps(env.base_env, lambda: taken.append(1))
    td = env.reset()
    target = td["observation", "state"][4:8]  # tracking mode: the target follows the echoed action
    td["action"] = target.expand(8, 4).clone()
    out = env.step(td)
    assert bool(out["next", "done"]) and bool(out["next", "success"]) and len(taken) == 3  # success_steps 3
    env.close()


def test_the_chunked_policy_writes_the_chunk_and_its_summed_log_prob():
    one, chunked = make(action_dim=7, image_size=16, state_dim=9), make(action_dim=7, image_size=16, state_dim=9, chunk_size=8)
    from tensordict import NonTensorStack, TensorDict

    td = TensorDict({"observation": {"image": torch.zeros(2, 3, 16, 16, dtype=torch.uint8), "state": torch.zeros(2, 9)},
                     "language_instruction": NonTensorStack("a", "b")}, batch_size=[2])
    assert one(td.clone())["action"].shape == (2, 7)
    out = chunked(td.clone())
    assert out["action"].shape == (2, 8, 7) and out["action_log_prob"].shape == (2,)
    assert torch.allclose(chunked.log_prob(out), out["action_log_prob"])


@pytest.mark.parametrize("chunk, transforms, error", [
    (8, CHUNK, None),
    (1, None, None),
    (1, CHUNK, "writes [4]: the envs take a chunk [N, 4] at action (MultiAction in env.transforms)"),
    (8, None, "writes [8, 4]: the envs take [4] at action"),
    (8, [{"name": "MultiAction.from_vla"}], "writes no vla_action.chunk: the envs take a chunk [N, 4] at vla_action.chunk"),
    (1, [{"name": "mypkg.mod:stack"}], None),  # a callable's stack is not known before its worker builds it
])
def test_async_action_slot_follows_the_stack(chunk, transforms, error):
    layout = get_backend("toy").layout({"state_dim": 8})
    kwargs = {"action_dim": 4, "image_size": 16, "state_dim": 8, "chunk_size": chunk}
    if error is None:
        _, response, _ = async_slots.slot_layouts(layout, "topo.policies.tinyvla:make", kwargs, transforms)
        assert tuple(response["action"].shape) == ((chunk, 4) if chunk > 1 else (4,))
        return
    with pytest.raises(UsageError) as found:
        async_slots.slot_layouts(layout, "topo.policies.tinyvla:make", kwargs, transforms)
    assert str(found.value).startswith("policy factory topo.policies.tinyvla:make " + error)


def test_an_eval_worker_under_the_stack_goes_idle_after_its_episodes():
    """An eval row's scheduled env under MultiAction and StepCounter: its episode, then idle episodes, never a
    reset that is done (its ``max_episode_steps`` truncation is not carried into the idle observation)."""
    schedule = {"episodes": [{"episode": 0, "task_id": 4, "init_state_id": None, "seed": 5}], "max_episode_steps": 8,
                "envs": {"4": {"action_dim": 2, "state_dim": 4, "success_steps": 3, "success_tol": 0.2}}}
    env = make_env(builder="topo.envs.toy:build", env={}, seed=1000, schedule=schedule, transforms=CHUNK)
    policy = make(action_dim=2, image_size=16, state_dim=4, chunk_size=4)
    td = env.rollout(6, policy, break_when_any_done=False)
    assert td["next", "eval_episode"].reshape(-1).tolist() == [0, 0, -1, -1, -1, -1]  # 8 env steps: 2 decisions
    assert td["next", "eval_length"].reshape(-1).tolist()[:2] == [4, 8]
    env.close()
