"""The server's shared-memory slots without processes: layouts from the plan and the backend's declaration
(never an env), strings as bytes, replies packed and unpacked, and a served policy answering a slot client."""
from __future__ import annotations

import pickle

import pytest
import torch
import yaml
from tensordict import NonTensorStack, TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

import topo
from topo.launch import policy as placement
from topo.launch import server_slots
from topo.policies.tinyvla import make

from tests.compiler.compiler_helpers import EXAMPLES
from tests.launch.launch_helpers import toy_spec, user_spec, write

TINYVLA = ("topo.policies.tinyvla:make", {"action_dim": 4, "image_size": 16, "state_dim": 8})


def plan_of(tmp_path, spec: dict) -> dict:
    return topo.compile_spec(str(write(tmp_path / "spec.yaml", spec)))


def carrier() -> TensorDict:
    return TensorDict({"observation": {"image": torch.randint(0, 255, (2, 3, 16, 16), dtype=torch.uint8),
                                       "state": torch.randn(2, 8)},
                       "language_instruction": NonTensorStack("lift", "place the bowl"),
                       "topo_episode": torch.zeros(2, dtype=torch.long)}, batch_size=[2])


def test_a_toy_plan_lays_out_its_slots_from_the_backend_declaration(tmp_path):
    lay, why = server_slots.layout(plan_of(tmp_path, toy_spec(2, 2)))
    assert why == "" and lay.workers == 2 and lay.text_bytes == server_slots.TEXT_BYTES
    assert lay.keys == {("observation", "image"): ((3, 16, 16), "uint8"), ("observation", "state"): ((8,), "float32"),
                        ("language_instruction",): ((), "str")}
    spec = server_slots.request_spec(lay)
    assert spec["observation", "image"].shape == (2, 3, 16, 16) and spec["language_instruction"].shape == (2, 256)


def test_a_libero_plan_lays_out_its_slots_too_unless_proprio_keys_choose_its_state(tmp_path):
    """The README's claim: the server's slots wherever the backend declares its layout, LIBERO's (the demo's) too."""
    spec = yaml.safe_load((EXAMPLES / "libero_cpu.yaml").read_text())
    lay, why = server_slots.layout(plan_of(tmp_path, spec))
    assert why == "" and lay.keys == {("observation", "image"): ((3, 64, 64), "uint8"),
                                      ("observation", "state"): ((9,), "float32"),
                                      ("language_instruction",): ((), "str")}
    spec["env"]["kwargs"]["proprio_keys"] = ["robot0_eef_pos"]
    lay, why = server_slots.layout(plan_of(tmp_path, spec))
    assert lay is None and why == "backend 'libero' declares no observation layout (Backend.observation_layout)"


def test_without_a_declared_layout_or_with_unequal_subcollectors_the_manager_stays_and_says_why(tmp_path):
    lay, why = server_slots.layout(plan_of(tmp_path, user_spec("topo.envs.toy:build")))
    assert lay is None and "declares no observation layout" in why
    uneven = toy_spec(2, 2, topology={"subcollectors": 2, "workers_per_subcollector": [1, 2]})
    lay, why = server_slots.layout(plan_of(tmp_path, uneven))
    assert lay is None and why.startswith("subcollectors of unequal sizes [1, 2]")


def test_strings_cross_as_bytes_and_one_too_long_is_refused():
    data = server_slots.encode_text(["lift", "", "été"], 8)
    assert data.dtype == torch.uint8 and data.shape == (3, 8)
    assert server_slots.decode_text(data.reshape(1, 3, 8)).tolist() == [["lift", "", "été"]]
    with pytest.raises(ValueError, match="9 UTF-8 bytes does not fit the server's slot of 8"):
        server_slots.encode_text(["123456789"], 8)


def test_a_reply_packs_and_unpacks_each_out_key_exactly():
    out = TensorDict({"action": torch.randn(3, 2, 4), "mask": torch.rand(3, 2, 5) > 0.5,
                      "n": torch.arange(6).reshape(3, 2)}, batch_size=[3, 2])
    packing = server_slots.reply_layout(out, ["action", "mask", "n"])
    assert packing == [("action", "float32", [4]), ("mask", "bool", [5]), ("n", "int64", [])]
    packed = server_slots.pack(out, packing)
    assert packed[server_slots.REPLY].shape == (3, 2, server_slots.REPLY_BYTES)
    reply = TensorDict({**packed[1], "policy_version": torch.full((2,), 7)}, batch_size=[2])
    back = server_slots.unpack(reply, packing)
    assert all(torch.equal(back[k], out[1][k]) for k in ("action", "mask", "n"))
    assert back["policy_version"].tolist() == [7, 7]


def test_a_reply_over_the_slot_is_refused():
    out = TensorDict({"big": torch.zeros(1, 2, server_slots.REPLY_BYTES // 4 + 1)}, batch_size=[1, 2])
    with pytest.raises(ValueError, match="take 8196 bytes per env, over the server slot's 8192"):
        server_slots.reply_layout(out, ["big"])


def test_a_slot_client_gets_what_the_served_policy_computes(tmp_path, monkeypatch):
    """The request and reply of one slot, crossing in-process: the served policy decodes, acts, packs; the client
    encodes and unpacks: the same action as a local copy, with the server's version."""
    monkeypatch.setattr(placement.os, "setpgid", lambda *a: None)
    lay, _ = server_slots.layout(plan_of(tmp_path, toy_spec(1, 2)))
    served = placement.in_server(*TINYVLA, slots=lay)
    packing = placement._packing(make(**TINYVLA[1]), lay, None)
    assert packing == [("action", "float32", [4]), ("action_log_prob", "float32", [])]

    def server(request):  # the server batches slots: [k, workers]
        sent.append(request)
        reply = served(request.unsqueeze(0).copy())[0]
        return TensorDict({**reply, "policy_version": torch.full((2,), 3)}, batch_size=[2])

    sent = []
    remote = placement.client(server, list(served.in_keys), ["action", "action_log_prob", placement.VERSION_KEY],
                              lay, packing)
    data = carrier()
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        out = remote(data)
    assert set(sent[0].keys(True, True)) == {("observation", "image"), ("observation", "state"), "language_instruction"}
    assert torch.allclose(out["action"], make(**TINYVLA[1]).mean(data))
    assert out["policy_version"].tolist() == [3, 3]


def test_a_policy_reading_an_undeclared_key_is_refused_when_the_server_starts(tmp_path):
    from tensordict.nn import TensorDictModule

    lay, _ = server_slots.layout(plan_of(tmp_path, toy_spec(1, 2)))
    policy = TensorDictModule(torch.nn.Linear(3, 4), in_keys=["depth"], out_keys=["action"])
    with pytest.raises(ValueError, match=r"the policy reads \['depth'\], which the backend's declared observation"):
        placement._packing(policy, lay, None)


def test_a_sync_before_the_trainers_first_forward_pushes_all_but_its_unmaterialised_lazy_layers():
    """The served copy of a lazy policy (the recipe's TinyVLA) is materialised by the server's packing forward; the
    trainer's lazy layers hold nothing until its own first forward: a sync leaves them to the copy (pushed as they
    are, they do not fit it), and pushes every tensor once they are materialised."""
    trainer = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LazyLinear(2))
    served = pickle.loads(pickle.dumps(trainer))
    served(torch.zeros(1, 3))
    weights = TensorDict.from_module(trainer).data
    with pytest.raises(RuntimeError, match="must match the size"):
        TensorDict.from_module(served).data.clone().update_(weights)
    pushed = placement.materialized(weights, trainer)
    assert sorted(pushed.keys(True, True)) == [("0", "bias"), ("0", "weight")]
    TensorDict.from_module(served).data.update_(pushed)
    assert torch.equal(served[0].weight, trainer[0].weight)
    trainer(torch.zeros(1, 3))
    assert len(placement.materialized(TensorDict.from_module(trainer).data, trainer).keys(True, True)) == 4
    assert placement.materialized(pushed, None) is pushed  # no trainer's policy to read: the weights as given


def test_inherited_unpickles_as_what_it_holds():
    assert pickle.loads(pickle.dumps(server_slots.Inherited({"a": 1}))) == {"a": 1}
