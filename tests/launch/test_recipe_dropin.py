"""The drop-in for torchrl's vla_grpo recipe (:mod:`topo.recipes.vla_grpo`): the recipe's ``make_collector``
signature and return value from a topo plan. One real-process run of the recipe's loop, written in
``recipe_trainer.py`` (toy 2 x 2, TinyVLA on topo's inference server, a shared replay buffer), and the mapping
logic without processes."""
from __future__ import annotations

import pickle
import sys
import tempfile
import time

import pytest
import torch
from tensordict import TensorDict

import topo
from tests import preimported
from tests.compiler.test_import import COMMITTED, imported_plan
from tests.launch.launch_helpers import HANG_GUARD_S, HERE, LAUNCH_LIMITS, subprocess_env, toy_spec, write
from tests.launch.script_events import parse
from tests.launch.test_restarts import assert_nothing_left, of
from topo.compiler.assign import GROUP_ID_OFFSET
from topo.launch.policy import PolicySetup
from topo.policies.tinyvla import make
from topo.recipes import vla_grpo
from topo.recipes.vla_grpo import SERVED_COPY, PolicyServer, ServedCopy, close, plan_of, served

TINY = {"action_dim": 4, "image_size": 16, "state_dim": 8}


@pytest.mark.slow
def test_the_recipes_loop_through_the_drop_in_collects_syncs_and_leaves_nothing(tmp_path):
    """Long: the module's one real-process run, the recipe's loop over toy 2 x 2 with TinyVLA on topo's inference
    server (a trainer, a server, 2 subcollectors, 4 workers), 3 iterations and its teardown."""
    # episodes that end within a few steps (the toy env truncates none): whole trajectories reach the buffer
    env = {"backend": "toy", "kwargs": {"success_steps": 1, "state_dim": 8, "success_tol": 0.5}}
    spec = write(tmp_path / "toy.yaml", toy_spec(2, 2, env=env, launch=dict(LAUNCH_LIMITS)))
    done = preimported.run([sys.executable, str(HERE / "recipe_trainer.py"), str(spec), str(tmp_path / "report"),
                           "--iterations", "3"], env=subprocess_env(), capture_output=True, text=True,
                           timeout=HANG_GUARD_S)
    t_end = time.time()
    events = list(parse(done.stdout))
    assert done.returncode == 0 and not of(events, "starved"), done.stderr[-3000:]
    (ready,), iterations, (after,) = of(events, "ready"), of(events, "iteration"), of(events, "after")
    assert ready["served"]["placement"] == "server" and ready["served"]["factory"] == SERVED_COPY
    # synced before start() (version 1), then once per pause; the rows acted with the versions synced
    assert [i["version"] for i in iterations] == [2, 3, 4] and iterations[0]["first"] == 1
    assert all(i["rows"] >= 48 * (n + 1) for n, i in enumerate(iterations))
    assert iterations[0]["versions"] == [1] and iterations[-1]["versions"][-1] >= 3
    assert all(i["eval_synced"] for i in iterations)  # eval_policy acts with the weights last synced
    report = after["report"]
    # each episode's rows carry its plan row's instruction and group, and versions the run recorded for it
    summaries = {e["id"]: e for e in after["episodes"]}
    rows = {(r["instruction"], r["group"]) for sub in topo.compile_spec(str(spec))["subcollectors"]
            for r in sub["workers"]}
    for eid, seen in iterations[-1]["by_episode"].items():
        summary = summaries[eid]
        assert seen["instructions"] == [summary["instruction"]] and seen["group_ids"] == [summary["group_id"]]
        assert (summary["instruction"], summary["group_id"] // GROUP_ID_OFFSET) in rows  # a group's ids: its block
        assert set(seen["versions"]) <= set(summary["policy_versions"])
    # whole trajectories only, as the recipe's Collector writes them (trajs_per_batch=1) for its MCAdvantage; with
    # its reset_collection_state in each pause (collector.map_fn("reset")), each acted with one version only
    episodes = iterations[-1]["by_episode"]
    assert {e.split("-")[0] for e in episodes} == {"w0", "w1", "w2", "w3"}  # every worker's rows reached it
    assert all(seen["last_done"] for seen in episodes.values())
    assert all(len(seen["versions"]) == 1 for seen in episodes.values())
    assert report["ok"] and report["restarts"] == [] and report["policy"]["placement"] == "server"
    assert report["policy"]["updates"] == 4
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert_nothing_left(report, t_end)


def toy_plan(tmp_path, **policy) -> dict:
    return topo.compile_spec(write(tmp_path / "toy.yaml", toy_spec(1, 2, **({"policy": policy} if policy else {}))))


def test_a_plan_without_a_policy_serves_a_copy_of_the_trainers_on_the_recipes_device(tmp_path):
    plan = served(toy_plan(tmp_path), torch.device("cpu"))
    assert plan["policy"] == {"factory": SERVED_COPY, "kwargs": {}, "placement": "server", "device": "cpu",
                              "weight_sync": "shared_mem"}
    topo.load(plan)  # a plan topo.collector accepts (the plan schema)


def test_a_specs_policy_is_kept_and_put_on_the_server(tmp_path):
    plan = served(toy_plan(tmp_path, factory="topo.policies.tinyvla:make", kwargs=TINY, device="cpu"), "cuda:1")
    section = plan["policy"]
    assert (section["factory"], section["kwargs"], section["placement"]) == ("topo.policies.tinyvla:make", TINY,
                                                                             "server")
    assert section["device"] == "cpu"  # the spec's device over the recipe's rollout device
    topo.load(plan)


def test_the_plan_is_the_imported_specs_unless_a_spec_is_given(tmp_path, monkeypatch):
    import yaml

    monkeypatch.delenv(vla_grpo.SPEC_VAR, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the imported spec's folder, in the test's
    _, expected = imported_plan(tmp_path)
    cfg = yaml.safe_load(COMMITTED)
    def rows_and_all(plan: dict) -> dict:  # the spec's path and digest aside (its header names the config file)
        return {k: v for k, v in plan.items() if k != "spec"}

    assert rows_and_all(plan_of(cfg)) == rows_and_all(expected)  # what `topo import vla-grpo` writes from it
    toy = write(tmp_path / "toy.yaml", toy_spec(1, 2))
    assert plan_of(cfg, toy)["name"] == "toy-1x2"
    monkeypatch.setenv(vla_grpo.SPEC_VAR, str(toy))
    assert plan_of(cfg)["name"] == "toy-1x2"


def test_the_imported_token_decoding_is_the_recipes_tokenizer_transform(tmp_path):
    """A token policy's imported stack builds, in topo's runtime, the recipe's ActionTokenizerTransform(
    UniformActionTokenizer(tokenizer.vocab_size, low=-1.0, high=1.0)) after MultiAction: the policy's tokens decode
    to the bin centres of [-1, 1]."""
    from torchrl.data.vla import UniformActionTokenizer
    from torchrl.envs import ActionTokenizerTransform, MultiAction

    from topo.runtime.transforms import build_stack

    _, plan = imported_plan(tmp_path, "policy.backend=tiny", "tokenizer.vocab_size=64")
    stack = build_stack(plan["env"]["transforms"])
    assert [type(t).__name__ for t in stack] == ["MultiAction", "ActionTokenizerTransform", "SuccessReward",
                                                 "StepCounter"]
    assert isinstance(stack[0], MultiAction) and isinstance(stack[1], ActionTokenizerTransform)
    tokens = TensorDict({("vla_action", "tokens"): torch.tensor([[0, 31], [32, 63]])}, batch_size=[])
    recipe = ActionTokenizerTransform(UniformActionTokenizer(64, low=-1.0, high=1.0))
    decoded = stack[1].inv(tokens.clone())["action"]
    assert decoded.tolist() == [[-0.984375, -0.015625], [0.015625, 0.984375]]  # -1 + (k + 0.5) * 2 / 64
    assert torch.equal(decoded, recipe.inv(tokens.clone())["action"])


def test_the_served_copy_is_the_trainers_policy_as_it_was_with_storage_of_its_own():
    policy = make(**TINY)
    factory = pickle.loads(pickle.dumps(ServedCopy(policy)))  # as it reaches the server process
    copy = factory()
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    ours, theirs = TensorDict.from_module(policy), TensorDict.from_module(copy)
    assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
    assert not torch.equal(next(policy.parameters()), next(copy.parameters()))
    assert PolicySetup(factory).describe()["factory"] == SERVED_COPY  # what launch.json and the report name


class FakeRun:
    """What the drop-in's objects call on a topo.Run."""

    def __init__(self, raises: BaseException | None = None):
        self.closed, self.raises, self.pushed, self.placement, self.report = [], raises, [], None, None

    def close(self, exc=None):
        self.closed.append(exc)
        return self.raises if self.raises is not None else exc

    def update_weights(self, weights):
        self.pushed.append(weights)
        return len(self.pushed)


def test_shutdown_ends_the_run_raises_its_failure_and_passes_the_loops_exception():
    run = FakeRun()
    close(run)
    assert run.closed == [None]
    failed = FakeRun(raises=topo.LaunchError("worker 1 of subcollector 0 died"))
    with pytest.raises(topo.LaunchError, match="worker 1"):
        close(failed)
    loop_error = KeyError("the loop's")
    with pytest.raises(KeyError):
        try:
            raise loop_error
        finally:
            close(run)  # the recipe's finally: the run ends with the loop's exception, which goes on
    assert run.closed[-1] is loop_error


def test_the_recipes_partial_sync_reaches_the_run_and_the_eval_policy():
    policy, eval_policy = make(**TINY), make(**TINY)
    run = FakeRun()
    server = PolicyServer(run, eval_policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5)
    weights = TensorDict.from_module(policy).apply(lambda t: t if t.requires_grad else None, filter_empty=True)
    assert server.update_model_weights(weights.data.detach().clone()) == 1
    assert run.pushed and all(torch.equal(a, b) for a, b in zip(policy.parameters(), eval_policy.parameters()))
    server.shutdown(), server.transport.close()
    assert run.closed == [None, None]


def test_a_sync_materialises_the_eval_copys_lazy_layers_as_the_trainers_first_update_did():
    trainer, copy = torch.nn.LazyLinear(3), torch.nn.LazyLinear(3)  # TinyVLA's layers are lazy until a forward
    trainer(torch.zeros(1, 5))
    vla_grpo.assign(copy, TensorDict.from_module(trainer).data.clone())
    assert torch.equal(copy.weight, trainer.weight) and copy.weight.shape == (3, 5)
    assert torch.equal(copy(torch.ones(1, 5)), trainer(torch.ones(1, 5)))
