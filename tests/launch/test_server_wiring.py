"""The server placement's requests and replies: a request carries the policy's in_keys only, a reply its
out_keys only (each tensor crossing costs shared memory of its own: benchmarks/server_cost.py)."""
from __future__ import annotations

import torch
from tensordict import NonTensorStack, TensorDict

from topo.launch import policy as placement

TINYVLA = ("topo.policies.tinyvla:make", {"action_dim": 4, "image_size": 16, "state_dim": 8})


def carrier() -> TensorDict:
    """A toy subcollector's carrier: the policy's inputs and what the collector and topo add."""
    return TensorDict({"observation": {"image": torch.zeros(2, 3, 16, 16, dtype=torch.uint8), "state": torch.zeros(2, 8)},
                       "language_instruction": NonTensorStack("lift", "place"), "done": torch.zeros(2, 1, dtype=torch.bool),
                       "collector": {"traj_ids": torch.zeros(2, dtype=torch.long)},
                       "topo_episode": torch.zeros(2, dtype=torch.long)}, batch_size=[2])


def test_the_served_policy_replies_with_its_out_keys_only(monkeypatch):
    monkeypatch.setattr(placement.os, "setpgid", lambda *a: None)  # the server's own process group: not pytest's
    served = placement.in_server(*TINYVLA)
    reply = served(carrier())
    assert set(reply.keys(True, True)) == {"action", "action_log_prob"}
    assert reply["action"].shape == (2, 4)


def test_a_client_sends_the_in_keys_only():
    sent = []

    def server(request):
        sent.append(request)
        return TensorDict({"action": torch.zeros(2, 4)}, batch_size=[2])

    remote = placement.client(server, [["observation", "image"], ["observation", "state"], "language_instruction"],
                              ["action", placement.VERSION_KEY])
    remote(carrier())
    assert set(sent[0].keys()) == {"observation", "language_instruction"}
    assert set(sent[0]["observation"].keys()) == {"image", "state"}
