"""``eval.protocol: libero``: the reference LIBERO evaluation as a plan (2,000 episodes whatever the eval workers),
narrowed as asked and said to be, its fixed numbers in every row, what contradicts it refused, located."""
from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.compiler.compiler_helpers import checked_of, compile_dict
from topo.cli import main
from topo.compiler.protocols import LIBERO

SPEC = Path(__file__).resolve().parents[2] / "examples" / "libero_protocol.yaml"
BASE = yaml.safe_load(SPEC.read_text())


def spec_with(**eval_section) -> dict:
    data = copy.deepcopy(BASE)
    data["eval"] = {"protocol": "libero", "workers": 2, **eval_section}
    return data


def episodes(plan: dict) -> list[dict]:
    return [ep for sub in plan["eval"]["subcollectors"] for row in sub["workers"] for ep in row["episodes"]]


@pytest.mark.parametrize("workers", range(1, 65))
def test_the_full_protocol_is_2000_episodes_each_task_and_init_state_once_for_any_worker_count(workers):
    plan = compile_dict(spec_with(workers=workers))
    got = episodes(plan)
    assert len(got) == plan["eval"]["episodes"] == 2000 and sum(len(s["workers"]) for s in plan["eval"]["subcollectors"]) == workers
    pairs = Counter((ep["task_id"], ep["init_state_id"]) for ep in got)
    assert set(pairs.values()) == {1} and set(pairs) == {(f"{suite}:{task}", state) for suite in LIBERO.suites
                                                           for task in range(10) for state in range(50)}
    assert {ep["seed"] for ep in got} == {7} and {ep["trial"] for ep in got} == {0}
    assert [ep["episode"] for ep in got] == list(range(2000))  # in order: suite, task, init state


def test_each_task_runs_its_suites_horizon_after_the_reference_settle_steps():
    plan = compile_dict(spec_with(workers=4))
    section = plan["eval"]
    assert section["protocol"]["narrowed"] is None and section["seeds"] == {"strategy": "fixed", "base": 7}
    assert section["protocol"]["horizons"] == {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
                                               "libero_10": 520}
    for row in (r for sub in section["subcollectors"] for r in sub["workers"]):
        schedule = row["kwargs"]["schedule"]
        for key, env in schedule["envs"].items():
            suite = key.partition(":")[0]
            assert (env["task_suite"], env["max_episode_steps"], env["settle_steps"]) == (
                suite, LIBERO.horizons[suite], 10)
        assert schedule["max_episode_steps"] == max(LIBERO.horizons[k.partition(":")[0]] for k in schedule["envs"])
    training = plan["subcollectors"][0]["workers"][0]["kwargs"]["env"]
    assert "settle_steps" not in training and training["max_episode_steps"] == 512  # training keeps its own


def test_a_narrowed_protocol_runs_what_it_names_and_says_it_is_narrowed():
    narrowed = {"suites": ["libero_spatial", "libero_object"], "tasks": "0-1", "init_states": "0-4"}
    _, checked = checked_of(spec_with(**narrowed))
    assert [d.code for d in checked.warnings] == ["protocol-narrowed"]
    assert "not comparable with the full protocol's" in checked.warnings[0].message
    plan = compile_dict(spec_with(**narrowed))
    assert [(ep["task_id"], ep["init_state_id"]) for ep in episodes(plan)] == [
        (f"{suite}:{task}", state) for suite in ("libero_spatial", "libero_object") for task in (0, 1)
        for state in range(5)]
    assert plan["eval"]["protocol"]["narrowed"] == narrowed
    out = CliRunner().invoke(main, ["plan", str(SPEC), "--dry-run", "--limit", "1"], env={"COLUMNS": "120"})
    assert "  protocol libero, full: steps per suite libero_spatial 220, libero_object 280, libero_goal 300, " \
           "libero_10 520; settle_steps 10; seed 7" in out.output


@pytest.mark.parametrize("section,code,path", [
    ({"trials": 3}, "protocol-fixes", ("eval", "trials")),
    ({"seeds": {"base": 1}}, "protocol-fixes", ("eval", "seeds")),
    ({"max_episode_steps": 100}, "protocol-fixes", ("eval", "max_episode_steps")),
    ({"tasks": "libero_goal:0"}, "protocol-task-suite", ("eval", "tasks")),
    ({"suites": ["libero_mine"]}, "protocol-suite", ("eval", "suites")),
    ({"suites": ["libero_spatal"]}, "libero-unknown-suite", None),
])
def test_what_contradicts_the_protocol_is_refused_and_located(section, code, path):
    _, checked = checked_of(spec_with(**section))
    found = [d for d in checked.errors if d.code == code]
    assert found, [d.format() for d in checked.diagnostics]
    assert path is None or found[0].path == path
    assert found[0].line is not None


def test_the_protocol_evaluates_libero_only():
    data = spec_with()
    data["env"] = {"backend": "toy", "kwargs": {}}
    data["assignment"] = {"tasks": "0-1"}
    assert "protocol-backend" in [d.code for d in checked_of(data)[1].errors]


def test_a_perturbed_suite_runs_at_its_base_suites_horizon():
    plan = compile_dict(spec_with(suites=["libero_goal_swap"], tasks=0, init_states=0, workers=1))
    assert plan["eval"]["protocol"]["horizons"] == {"libero_goal_swap": 300}


def test_eval_protocol_options_need_a_spec_and_a_protocol(tmp_path):
    plan = tmp_path / "plan.json"
    assert CliRunner().invoke(main, ["plan", str(SPEC), "-o", str(plan)]).exit_code == 0
    refused = CliRunner().invoke(main, ["eval", str(plan), "--protocol", "libero"])
    assert refused.exit_code == 2 and "give the spec, not a saved plan" in refused.output, refused.output
    alone = CliRunner().invoke(main, ["eval", str(SPEC), "--suites", "libero_goal"])
    assert alone.exit_code == 2 and "give --protocol too" in alone.output, alone.output


def test_variants_run_beside_each_suite_on_the_same_tasks_init_states_and_seeds():
    data = copy.deepcopy(BASE)
    data["eval"] = {"tasks": "libero_goal:0-1", "init_states": "0-1", "variants": ["swap", "lan"], "workers": 2,
                    "max_episode_steps": 8}
    plan = compile_dict(data)
    assert plan["eval"]["variants"] == {"libero_goal_swap": "libero_goal", "libero_goal_lan": "libero_goal"}
    got = {(ep["task_id"], ep["init_state_id"]): ep["seed"] for ep in episodes(plan)}
    assert sorted({task.partition(":")[0] for task, _ in got}) == ["libero_goal", "libero_goal_lan", "libero_goal_swap"]
    for (task, state), seed in got.items():
        suite, _, rest = task.partition(":")
        assert seed == got[(f"libero_goal:{rest}", state)]  # a pair differs by the perturbation alone
    assert len(got) == 12 and len(set(got.values())) == 4


def test_variants_under_the_protocol_run_at_their_base_suites_horizon():
    plan = compile_dict(spec_with(suites=["libero_goal"], tasks=0, init_states=0, variants=["swap"], workers=1))
    assert plan["eval"]["protocol"]["horizons"] == {"libero_goal": 300, "libero_goal_swap": 300}
    assert [ep["task_id"] for ep in episodes(plan)] == ["libero_goal:0", "libero_goal_swap:0"]
