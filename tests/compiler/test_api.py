"""The public API a training script reads (``topo.load``, ``topo.Plan``): the same checks, the same table and
the same file as the CLI, and no torch imported."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

import topo
from topo.cli import main
from topo.errors import SpecError, StalePlanError, UsageError
from topo.compiler.saved import read_plan
from topo.compiler.load import parse_assignments
from topo.compiler.planfile import digest

from tests.compiler.compiler_helpers import EXAMPLES, ROOT, rows
from tests.compiler.test_bad_specs import CORPUS, header

TOY = EXAMPLES / "toy_2x3.yaml"
TEMPLATE = EXAMPLES / "libero_template.yaml.j2"


def cli(*args) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "120"}, prog_name="topo")
    assert result.exit_code == 0, result.output
    return result.stdout


def test_public_names():
    assert sorted(topo.__all__) == sorted([
        "Checked", "EpisodeId", "Episodes", "LaunchError", "Plan", "PlanSource", "Row", "Run", "Source", "SpecError",
        "StalePlanError", "Subcollector", "TopoError", "UsageError", "__version__", "collector", "compile_source",
        "compile_spec", "episode_id", "eval_table", "load", "load_spec", "validate"])
    assert all(hasattr(topo, name) for name in topo.__all__)
    assert (Path(topo.__file__).parent / "py.typed").is_file()  # PEP 561 marker (package-data in pyproject)


def test_a_spec_loads_as_its_compiled_plan():
    plan, compiled = topo.load(TOY), topo.compile_spec(TOY)
    assert isinstance(plan, topo.Plan) and plan.data == compiled and plan.to_dict() == compiled
    assert plan.to_dict() is not plan.data
    assert plan.rows == rows(compiled) and [r["global_index"] for r in plan.rows] == list(range(6))
    assert plan.subcollectors == compiled["subcollectors"]
    assert plan.coverage == compiled["coverage"] and plan.coverage["workers"] == 6
    assert plan.policy == compiled["policy"] and plan.policy["factory"] == "topo.policies.tinyvla:make"
    assert (plan.engine, plan.name, plan.allow_edited) == ("local", "toy-2x3", False)
    assert repr(plan) == ("<topo.Plan 'toy-2x3': 2 subcollector(s), 6 workers, backend toy, engine local, "
                          "policy topo.policies.tinyvla:make>")


def test_the_typed_rows_name_every_key_a_row_has():
    plan = topo.load(TOY)
    assert set(plan.rows[0]) == set(topo.Row.__required_keys__) | set(topo.Row.__optional_keys__)
    assert set(plan.subcollectors[0]) == set(topo.Subcollector.__required_keys__)


def test_a_template_takes_variables_and_a_dict_takes_none():
    plan = topo.load(TEMPLATE, variables={"subcollectors": "2", "workers": "40"})
    assert plan.data == topo.compile_spec(TEMPLATE, {"subcollectors": "2", "workers": "40"})
    assert topo.load(plan.data).data is plan.data  # a plan dict: checked, and run as it is
    assert topo.load(plan) is plan
    with pytest.raises(UsageError, match="a plan dict takes neither"):
        topo.load(plan.data, variables={"workers": "4"})
    with pytest.raises(UsageError, match="already a loaded Plan"):
        topo.load(plan, allow_edited=True)


def test_dry_run_is_what_the_cli_prints():
    plan = topo.load(TOY)
    assert plan.dry_run() == cli("plan", TOY, "--dry-run")
    assert plan.dry_run(limit=1) == cli("plan", TOY, "--dry-run", "--limit", "1")


def test_save_writes_what_plan_o_writes_and_launch_reads_it_back(tmp_path):
    plan = topo.load(TOY)
    plan.save(tmp_path / "api.json")
    cli("plan", TOY, "-o", tmp_path / "cli.json")
    assert (tmp_path / "api.json").read_bytes() == (tmp_path / "cli.json").read_bytes()
    warnings = []
    saved = read_plan(str(tmp_path / "api.json"), warnings=warnings)  # topo launch's reader: digest required
    assert warnings == [] and saved["digest"] == digest(saved)
    assert {k: v for k, v in saved.items() if k != "digest"} == plan.data
    again = topo.load(tmp_path / "api.json")
    assert again.data == saved and again.rows == plan.rows
    again.save(tmp_path / "again.json")  # a saved plan saves to the same bytes
    assert (tmp_path / "again.json").read_bytes() == (tmp_path / "cli.json").read_bytes()


def test_an_edited_plan_is_refused_unless_allowed_and_never_sealed_anew(tmp_path):
    topo.load(TOY).save(tmp_path / "plan.json")
    data = json.loads((tmp_path / "plan.json").read_text())
    data["subcollectors"][0]["workers"][0]["seed"] = data["subcollectors"][0]["workers"][0]["kwargs"]["seed"] = 7
    (tmp_path / "plan.json").write_text(json.dumps(data))
    with pytest.raises(SpecError) as caught:
        topo.load(tmp_path / "plan.json")
    assert {d.code for d in caught.value.diagnostics} == {"plan-edited"}
    edited = topo.load(tmp_path / "plan.json", allow_edited=True)
    assert edited.allow_edited and edited.rows[0]["seed"] == 7
    with pytest.raises(UsageError, match="changed after topo wrote it"):
        edited.save(tmp_path / "resealed.json")
    assert not (tmp_path / "resealed.json").exists()


def test_a_stale_plan_is_refused(tmp_path):
    spec = tmp_path / "toy.yaml"
    spec.write_text(TOY.read_text())
    topo.load(spec).save(tmp_path / "plan.json")
    spec.write_text(TOY.read_text().replace("frames_per_batch: 12", "frames_per_batch: 24"))
    with pytest.raises(StalePlanError, match="plan is stale"):
        topo.load(tmp_path / "plan.json")
    with pytest.raises(UsageError, match="only apply to a spec"):
        topo.load(tmp_path / "plan.json", variables={"x": "1"})


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_a_bad_spec_raises_what_validate_reports(path: Path):
    """Every spec of the bad-spec corpus: the same diagnostics as `topo validate`, each at its file:line."""
    h = header(path)
    sets = [value for flag, value in zip(h["args"], h["args"][1:]) if flag == "--set"]
    if "--strict" in h["args"]:  # warnings only: they fail `validate --strict`, not a load (nor `topo launch`)
        assert isinstance(topo.load(path, variables=parse_assignments(sets)), topo.Plan)
        return
    with pytest.raises(SpecError) as caught:
        topo.load(path, variables=parse_assignments(sets))
    found = caught.value.diagnostics
    assert all(d.file == str(path) for d in found if d.line is not None)
    assert Counter((d.code, d.line) for d in found) == Counter(h["expect"])


def test_make_policy_calls_the_factory_with_its_kwargs():
    data = topo.compile_spec(TOY)
    data["policy"] = {**data["policy"], "factory": "builtins:dict", "kwargs": {"action_dim": 4}}
    assert topo.Plan(data).make_policy() == {"action_dim": 4}
    del data["policy"]
    with pytest.raises(UsageError, match="no policy section"):
        topo.Plan(data).make_policy()


def test_collector_takes_a_plan_and_refuses_what_only_loading_takes():
    plan = topo.load(TOY)
    with pytest.raises(UsageError, match="pass them to topo.load"):
        topo.collector(plan, variables={"x": "1"})


def test_loading_and_reading_a_plan_imports_no_torch(tmp_path):
    code = f"""
import sys, topo
plan = topo.load({str(TOY)!r})
plan.rows, plan.coverage, plan.dry_run(), plan.save({str(tmp_path / 'plan.json')!r}), repr(plan)
topo.load({str(tmp_path / 'plan.json')!r})
heavy = [m for m in ("torch", "torchrl", "tensordict", "numpy") if m in sys.modules]
assert not heavy, heavy
"""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert not [m for m in imported if m.split(".")[0] in ("torch", "torchrl", "tensordict")]
