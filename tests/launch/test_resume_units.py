"""A resume's state, without processes: it round-trips as plain JSON; a state of another plan is refused naming each part
that differs; a file that is no state (corrupt, hostile, of another topo) is refused naming the file, exit 2; a killed
run's directory gives every life and round its records name; a resumed run's rows are the next life's."""
from __future__ import annotations

import json
import os

import pytest

import topo
from topo.errors import RecordError, UsageError
from topo.launch import resume
from topo.launch.resume import Resumed
from topo.launch.supervision.lives import life_plan

from tests.launch.launch_helpers import toy_spec, write


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return topo.load(write(tmp_path_factory.mktemp("spec") / "spec.yaml", toy_spec(2, 2))).data


def other(plan, tmp_path, **changes):
    data = toy_spec(2, 2)
    for section, values in changes.items():
        data[section] = {**data[section], **values}
    return topo.load(write(tmp_path / "other.yaml", data)).data


def test_a_state_round_trips_as_json(plan):
    at = Resumed(lives=3, eval_lives=2, eval_rounds=4, policy_version=20, batches=20, run_dir="/runs/topo-run-a")
    data = json.loads(json.dumps(resume.state(plan, "/runs/topo-run-a", at)))
    assert resume.read(data, plan) == at
    assert len(json.dumps(data)) < 8192  # small: the plan's parts as digests, not the plan


def test_a_state_of_another_plan_is_refused_naming_what_differs(plan, tmp_path):
    data = resume.state(plan, "/runs/topo-run-a", Resumed(lives=1))
    changed = other(plan, tmp_path, assignment={"seeds": {"base": 7}}, launch={"restarts": {"max": 2}})
    with pytest.raises(UsageError) as err:
        resume.read(data, changed)
    message = str(err.value)
    assert message.startswith("resume: this plan is not the plan of the run it resumes (/runs/topo-run-a): ")
    differ = message.split(": ", 2)[2].split("; resume with")[0].split("; ")
    assert differ == ["launch.restarts differs", "seeds.base differs", "subcollectors[0] differs",
                      "subcollectors[1] differs"]
    assert err.value.exit_code == 2


def test_where_the_plan_came_from_is_not_compared(plan, tmp_path):
    data = resume.state(plan, None, Resumed(lives=1))
    moved = topo.load(write(tmp_path / "elsewhere.yaml", toy_spec(2, 2))).data
    assert moved["spec"]["path"] != plan["spec"]["path"]  # compiled from elsewhere; what it runs is the same
    assert resume.read(data, moved) == Resumed(lives=1)


BAD = {
    "not-json": (b"{\"format\": ", "not JSON"),
    "a-list": (b"[1, 2]", "a list, not a resume state (a JSON object)"),
    "deep": (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    "huge": (b" " * (resume.MAX_STATE_BYTES + 1), "more than 1,048,576 bytes: not a resume state"),
    "format": (None, "format 'topo.pickle/1', not 'topo.resume/1'"),
    "negative": (None, "lives must be an integer in [0, 16384), got -1"),
    "text": (None, "policy_version must be an integer in [0, 4611686018427387904), got __import__('os')"),
    "extra": (None, "unknown keys __reduce__"),
    "plan": (None, "plan must map each part of the plan to its digest"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_file_that_is_no_state_is_refused_naming_it(plan, tmp_path, case):
    raw, expected = BAD[case]
    if raw is None:
        data = resume.state(plan, None, Resumed(lives=1))
        data.update({"format": {"format": "topo.pickle/1"}, "negative": {"lives": -1},
                     "text": {"policy_version": "__import__('os')"}, "extra": {"__reduce__": "os.system"},
                     "plan": {"plan": {"seeds.base": 1}}}[case])
        raw = json.dumps(data).encode()
    path = tmp_path / "state.json"
    path.write_bytes(raw)
    with pytest.raises(RecordError) as err:
        resume.read(str(path), plan)
    assert err.value.file == str(path) and expected in str(err.value)
    assert err.value.exit_code == 2 and err.value.format().startswith(f"error: {path}: ")
    assert "hint: resume= takes run.state_dict()" in err.value.format()


def test_resume_takes_a_state_a_path_or_a_directory_and_nothing_else(plan, tmp_path):
    with pytest.raises(UsageError, match="resume= takes run.state_dict"):
        resume.read(42, plan)
    with pytest.raises(UsageError, match="is not a topo run directory"):
        resume.read(str(tmp_path), plan)
    (tmp_path / "launch.json").write_text("{}")
    with pytest.raises(RecordError, match="no resume state"):
        resume.read(str(tmp_path), plan)


def test_a_killed_runs_directory_gives_every_life_and_round_its_records_name(plan, tmp_path):
    """resume.json is written at each weight update: a restart (life 3 of subcollector 1) and a round begun after
    the last one still count, so a resumed run reuses neither a life nor a round number."""
    run_dir = tmp_path / "report" / "topo-run-x"
    for name in ("beats/sub0.r0.bin", "beats/sub1.r3.bin", "episodes/w0.r0.jsonl", "episodes/w2.r2.jsonl",
                 "eval/round-001.json", "eval/round-006.json", "eval/collector/topo-run-e/episodes/eval-w1.r4.jsonl",
                 "launch.json"):
        os.makedirs(run_dir / os.path.dirname(name), exist_ok=True)
        (run_dir / name).write_text("{}")
    resume.write(str(run_dir), resume.state(plan, str(run_dir), Resumed(lives=2, eval_lives=1, eval_rounds=5,
                                                                         policy_version=20, batches=20)))
    want = Resumed(lives=4, eval_lives=5, eval_rounds=6, policy_version=20, batches=20, run_dir=str(run_dir))
    assert resume.read(str(run_dir), plan) == want
    assert resume.read(str(tmp_path / "report"), plan) == want  # a report directory: its latest run


def test_a_resumed_runs_rows_are_the_next_lifes(plan):
    """Life k runs each row with seed planned + k x workers, as the k-th restart does; life 0 is the plan itself."""
    assert life_plan(plan, 0) is plan
    rows = [row for sub in life_plan(plan, 3)["subcollectors"] for row in sub["workers"]]
    assert [row["seed"] for row in rows] == [100 + g + 3 * 4 for g in range(4)]
    assert [row["kwargs"]["seed"] for row in rows] == [row["seed"] for row in rows]
    assert [row["global_index"] for row in rows] == [0, 1, 2, 3]


def test_a_run_that_cannot_resume_yet_is_refused_before_anything_starts(tmp_path):
    from topo.launch.run import Run

    data = toy_spec(1, 2, policy={"factory": "topo.policies.tinyvla:make", "placement": "server",
                                  "kwargs": {"action_dim": 4, "image_size": 16, "state_dim": 8}})
    plan = topo.load(write(tmp_path / "served.yaml", data)).data
    state = resume.state(plan, None, Resumed(lives=1, policy_version=3))
    with pytest.raises(UsageError, match="Ray, async mode and the inference server do not resume yet"):
        Run(plan, resume=state)
