"""Async mode without processes: the declared layouts, the slots built from them (never from an env), the
instruction's bytes both ways, the observer's per-subcollector records, the engine chosen by the plan."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from topo.backends import get_backend
from topo.backends.base import INSTRUCTION_BYTES
from topo.errors import UsageError
from topo.launch.async_mode import slots as async_slots
from topo.launch.async_mode.engine import AsyncEngine, Observer
from topo.launch.instruction_bytes import as_bytes, decode, encode
from topo.launch.engines import engine_for
from topo.runtime.rundir import RunDir

TINYVLA = ("topo.policies.tinyvla:make", {"action_dim": 4, "image_size": 16, "state_dim": 8})


def test_toy_and_libero_declare_their_layouts():
    toy = get_backend("toy").layout({"state_dim": 8, "action_dim": 7, "image_shape": [3, 32, 32]})
    assert toy.observation == {"observation.image": ((3, 32, 32), "uint8"), "observation.state": ((8,), "float32")}
    assert toy.action == {"action": ((7,), "float32")} and toy.instruction == "language_instruction"
    libero = get_backend("libero")
    wrist = libero.layout({"camera_height": 64, "camera_width": 64, "wrist_camera": "robot0_eye_in_hand"})
    assert wrist.observation == {"observation.image": ((3, 64, 64), "uint8"), "observation.state": ((9,), "float32"),
                                 "observation.wrist_image": ((3, 64, 64), "uint8")}
    assert libero.layout({"proprio_keys": ["robot0_eef_pos"]}) is None  # its state size is the env's to say
    assert get_backend("gym").layout({"env_name": "Pendulum-v1"}) is None


def test_slots_come_from_the_layout_and_one_forward():
    layout = get_backend("toy").layout({"state_dim": 8})
    request, response, instruction = async_slots.slot_layouts(layout, *TINYVLA)
    assert instruction == "language_instruction"
    assert {k: (tuple(v.shape), v.dtype) for k, v in request.items(True, True)} == {
        ("observation", "image"): ((3, 16, 16), torch.uint8), ("observation", "state"): ((8,), torch.float32),
        ("topo", "instruction"): ((INSTRUCTION_BYTES,), torch.uint8)}
    assert {k: tuple(v.shape) for k, v in response.items(True, True)} == {
        "action": (4,), "action_log_prob": (), "policy_version": ()}


def no_keys():
    return TensorDictModule(torch.nn.Linear(2, 2), in_keys=["x"], out_keys=["y"]).module


def reads_depth():
    return TensorDictModule(torch.nn.Linear(2, 2), in_keys=[("observation", "depth")], out_keys=["action"])


def test_a_policy_without_keys_or_reading_an_undeclared_key_is_refused_naming_its_factory():
    layout = get_backend("toy").layout({})
    with pytest.raises(TypeError, match="not a TensorDictModuleBase"):
        async_slots.slot_layouts(layout, f"{__name__}:no_keys", {})
    with pytest.raises(UsageError, match=r"reads_depth reads 'observation.depth', which the backend's declared"):
        async_slots.slot_layouts(layout, f"{__name__}:reads_depth", {})


def test_an_instruction_crosses_the_slot_as_bytes():
    words = ["push the block", "", "é" * 10]
    assert decode(torch.stack([encode(w) for w in words])) == words
    assert decode(encode("x" * 1000)) == ["x" * INSTRUCTION_BYTES]


def test_the_observer_writes_each_subcollectors_record_from_the_rows_that_took_the_steps(tmp_path):
    plan = {"env": {"backend": "toy"}, "subcollectors": [
        {"index": 0, "num_workers": 2, "workers": [{"index": 0, "instruction": "a", "group": 0},
                                                   {"index": 1, "instruction": "b", "group": 1}]},
        {"index": 1, "num_workers": 1, "workers": [{"index": 0, "instruction": "c", "group": 2}]}]}
    run, seen = RunDir(str(tmp_path)), []
    batch = TensorDict({"env_index": torch.tensor([1, 1, 2]), "policy_version": torch.tensor([0, 0, 3]),
                        "language_instruction": ["b", "b", "c"], "group_id": torch.tensor([10**6, 10**6, 2 * 10**6])},
                       batch_size=[3])
    Observer(plan, run, seen.append)(batch)
    records = {r["subcollector"]: r for r in run.read_all("observed")}
    assert records[0]["first"] == [{}, {"instructions": ["b"], "groups": [1]}] and records[0]["policy_versions"] == [0]
    assert records[1]["first"] == [{"instructions": ["c"], "groups": [2]}] and records[1]["policy_versions"] == [3]
    assert seen == [batch]  # the user's hook, after topo's


def test_the_plan_chooses_the_async_engine():
    plan = {"collector": {"mode": "async"}, "placement": None, "subcollectors": []}
    assert isinstance(engine_for(plan), AsyncEngine)
    assert {"restarts", "serves_policy", "weight_updates"} == engine_for(plan).capabilities


def test_a_batch_for_a_shared_buffer_carries_its_instructions_as_bytes_and_the_collectors_own_is_untouched():
    import pickle

    from tensordict import NonTensorStack
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from topo.launch.instruction_bytes import INSTRUCTION_KEY, Buffer

    batch = TensorDict({"obs": torch.zeros(2, 3), "next": {"obs": torch.zeros(2, 3)}}, [2, 3])
    words = NonTensorStack(*[NonTensorStack(*[w] * 3) for w in ("push left", "lift")])
    batch["language_instruction"] = batch["next", "language_instruction"] = words
    out = as_bytes(batch, "language_instruction")
    assert "language_instruction" not in out.keys() and ("next", "language_instruction") not in out.keys(True)
    assert decode(out[INSTRUCTION_KEY]) == ["push left"] * 3 + ["lift"] * 3
    assert "language_instruction" in batch.keys()  # the collector's buffers keep their strings
    buffer = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    wrapped = Buffer(buffer, "language_instruction")
    assert isinstance(pickle.loads(pickle.dumps(wrapped)).storage, LazyTensorStorage)  # as a subcollector gets it
    wrapped.extend(batch.reshape(-1))
    assert len(wrapped) == 6 and decode(buffer[:6][INSTRUCTION_KEY]) == ["push left"] * 3 + ["lift"] * 3
