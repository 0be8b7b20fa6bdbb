"""The certificate's pure parts: sealing, reading what is not one (exit 2, named), drawing, narrowing a plan."""
from __future__ import annotations

import json

import pytest

from topo.compiler.plan import compile_spec
from topo.errors import RecordError
from topo.launch.evaluation import certificate

EPISODES = [{"episode": i, "task_id": 4 + i // 3, "init_state_id": None, "seed": 10 + i, "trial": i % 3,
             "success": i % 2 == 0, "length": 5, "checksum": 1.5 * i, "init_state_applied": None,
             "episode_id": f"eval-w0-r0-e{i}"} for i in range(6)]


def sealed(**changes) -> dict:
    body = {"format": certificate.FORMAT, "spec": {"path": "s.yaml", "sha256": "ab" * 32, "variables": {}},
            "plan": {"name": "p", "sha256": "cd" * 32}, "runs": [{"weights": None, "episodes": EPISODES}]}
    return certificate.seal({**body, **changes})


@pytest.mark.parametrize("content,says", [
    ("{not json", "not JSON"),
    ("[]", "not an evaluation certificate"),
    (json.dumps({"format": "topo.plan/1"}), "not an evaluation certificate (format 'topo.plan/1'"),
    (json.dumps(sealed(runs=[])), "it holds no runs"),
    (json.dumps(sealed(runs=[{"weights": "a.pt", "episodes": []}])), "runs[0] is not a run"),
    (json.dumps(sealed(runs=[{"weights": None, "episodes": [{"episode": True}]}])), "runs[0].episodes[0]"),
    (json.dumps({**sealed(), "digest": "0" * 64}), "its digest does not match"),
])
def test_what_is_not_a_certificate_is_refused_and_named(tmp_path, content, says):
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(RecordError) as err:
        certificate.read(str(path))
    assert says in str(err.value) and str(path) in str(err.value) and err.value.exit_code == 2


def test_a_sealed_certificate_reads_back_and_any_edit_breaks_its_digest(tmp_path):
    path = tmp_path / "c.json"
    certificate.write(str(path), sealed())
    assert certificate.read(str(path))["runs"][0]["episodes"] == EPISODES
    data = json.loads(path.read_text())
    data["runs"][0]["episodes"][2]["length"] = 6
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="digest does not match"):
        certificate.read(str(path))


def test_a_draw_is_its_seeds_and_all_without_a_size():
    cert = sealed()
    assert certificate.sample(cert, None, 0) == list(range(6)) == certificate.sample(cert, 99, 0)
    assert certificate.sample(cert, 3, 7) == certificate.sample(cert, 3, 7)
    assert len({tuple(certificate.sample(cert, 3, seed)) for seed in range(10)}) > 1
    assert len(certificate.sample(cert, 3, 7)) == 3


def test_the_first_difference_is_named_in_field_order():
    e = EPISODES[1]
    assert certificate.first_difference(e, dict(e)) is None
    assert certificate.first_difference(e, {**e, "length": 9, "checksum": 0.0}) == "length (certificate 5, here 9)"
    assert certificate.first_difference(e, {**e, "episode_id": "eval-w1-r0-e0"}) is None  # another run's id
    assert certificate.first_difference(e, None).startswith("ended")


def test_a_narrowed_plan_keeps_each_episode_as_planned_and_every_row():
    plan = compile_spec("examples/toy_eval.yaml")
    before = {ep["episode"]: ep for sub in plan["eval"]["subcollectors"] for row in sub["workers"]
              for ep in row["episodes"]}
    narrowed = certificate.narrowed(plan, {30, 31})
    rows = [row for sub in narrowed["eval"]["subcollectors"] for row in sub["workers"]]
    assert [[ep["episode"] for ep in row["episodes"]] for row in rows] == [[], [30, 31]]  # row 0 idles
    assert all(ep == before[ep["episode"]] for row in rows for ep in row["episodes"])
    assert [r["kwargs"]["schedule"]["episodes"] for r in rows] == [r["episodes"] for r in rows]
    kept = [row for sub in plan["eval"]["subcollectors"] for row in sub["workers"]]
    assert [(r["kwargs"]["seed"], r["kwargs"]["worker"], r["kwargs"]["env"]) for r in rows] \
        == [(r["kwargs"]["seed"], r["kwargs"]["worker"], r["kwargs"]["env"]) for r in kept]
    assert narrowed["eval"]["episodes"] == 2 and plan["eval"]["episodes"] == 40  # the plan given is unchanged


def test_a_scheduled_env_without_episodes_idles_in_its_first_tasks_env():
    from topo.envs.scheduled import ScheduledEnv
    from topo.envs.toy import build

    plan = compile_spec("examples/toy_eval.yaml")
    schedule = {**plan["eval"]["subcollectors"][0]["workers"][0]["kwargs"]["schedule"], "episodes": []}
    env = ScheduledEnv(schedule, lambda kwargs: build(kwargs), lambda: 1)
    td = env.reset()
    assert env.rebuilds == 0 and int(td["eval_episode"]) == -1
    step = env.step(td.set("action", env.action_spec.zero()))
    assert int(step["next", "eval_episode"]) == -1 and bool(step["next", "done"])
    env.close()
