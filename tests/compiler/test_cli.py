"""The command line through click's CliRunner: help, plan formats, --limit, -o, and every example."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from click.testing import CliRunner

from topo.cli import main

from tests.compiler.compiler_helpers import EXAMPLES

SPEC_5X64 = EXAMPLES / "libero_spatial_5x64.yaml"
TOY = EXAMPLES / "toy_2x3.yaml"


def run(*args, **env):
    result = CliRunner().invoke(main, [str(a) for a in args], env={"COLUMNS": "120", **env}, prog_name="topo")
    assert "Traceback" not in result.output, result.output
    return result


def test_top_level_help():
    result = run("--help")
    assert result.exit_code == 0
    out = result.output
    assert "Compile TorchRL environment topologies from a declarative spec." in out
    for command in ("validate", "plan", "launch"):
        assert re.search(rf"^\s+{command}\s+\S", out, re.M), f"{command} not listed:\n{out}"
    assert run("-h").output == out


def test_validate_help():
    result = run("validate", "--help")
    assert result.exit_code == 0
    out = result.output
    assert "Usage: topo validate [OPTIONS] SPEC" in out
    assert "every problem at once" in out and "Exit 0 when valid, 2 when not" in out
    for option in ("--set KEY=VALUE", "--strict", "--format [text|json]"):
        assert option in out


def test_plan_help():
    result = run("plan", "--help")
    assert result.exit_code == 0
    out = result.output
    assert "Usage: topo plan [OPTIONS] SPEC" in out
    for option in ("--dry-run", "--format [table|json|yaml]", "--limit", "-o, --out FILE", "--strict", "--set"):
        assert option in out


def test_version():
    result = run("--version")
    assert result.exit_code == 0 and "0.1.0" in result.output


def test_plan_formats_agree():
    as_json = run("plan", TOY, "--format", "json")
    as_yaml = run("plan", TOY, "--format", "yaml")
    assert as_json.exit_code == as_yaml.exit_code == 0
    plan = json.loads(as_json.stdout)
    assert yaml.safe_load(as_yaml.stdout) == plan
    assert plan["format"] == "topo.plan/1"
    assert [r["global_index"] for s in plan["subcollectors"] for r in s["workers"]] == list(range(6))


def test_plan_table_and_limit():
    full = run("plan", TOY, "--dry-run").stdout
    assert full.count("toy task") == 0  # the example overrides every instruction
    assert full.count("push the block to the left") == 2
    assert "more worker(s)" not in full
    limited = run("plan", TOY, "--dry-run", "--limit", "1").stdout
    assert limited.count("  ... 2 more worker(s)") == 2
    data_rows = [line for line in limited.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\d+\s", line)]
    assert len(data_rows) == 2  # one per subcollector
    assert run("plan", TOY, "--limit", "0").stdout.count("  ... 3 more worker(s)") == 2
    assert run("plan", TOY, "--limit", "-1").exit_code == 2


def test_plan_out_writes_the_json_plan(tmp_path):
    out = tmp_path / "plan.json"
    saved = run("plan", TOY, "-o", out)
    assert saved.exit_code == 0
    assert f"plan saved to {out} (6 workers)" in saved.stderr
    assert saved.stdout == ""  # -o without --dry-run prints no table
    printed = run("plan", TOY, "--format", "json").stdout
    assert out.read_text(encoding="utf-8") == printed
    assert json.loads(printed)["name"] == "toy-2x3"
    both = run("plan", TOY, "-o", tmp_path / "again.json", "--dry-run")
    assert "subcollector 0: 3 workers" in both.stdout
    assert (tmp_path / "again.json").read_text(encoding="utf-8") == printed


def test_plan_out_to_a_missing_folder(tmp_path):
    result = run("plan", TOY, "-o", tmp_path / "no" / "such" / "plan.json")
    assert result.exit_code == 2
    assert "cannot write the plan" in result.output


def test_plan_of_a_bad_spec_exits_2(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("version: 1\nenv: {backend: toy}\ntopology: {subcollectors: 0, workers_per_subcollector: 1}\n")
    result = run("plan", spec)
    assert result.exit_code == 2
    assert f"{spec}:3:" in result.output and "schema-minimum" in result.output


def _examples():
    return sorted(p for p in EXAMPLES.iterdir() if p.is_file() and p.suffix != ".py")  # specs, not scripts


def _set_args(path):
    """The --set values a template's header comment gives (e.g. ``--set subcollectors=2 --set workers=40``)."""
    first = path.read_text(encoding="utf-8").splitlines()[0]
    pairs = re.findall(r"--set\s+(\S+=\S+)", first)
    return [arg for pair in pairs for arg in ("--set", pair)]


def test_there_are_examples():
    names = {p.name for p in _examples()}
    assert {"libero_spatial_5x64.yaml", "libero_spatial_4x80.yaml", "toy_2x3.yaml", "libero_template.yaml.j2"} <= names


# the warnings an example is there to show, exactly: the recipe as imported evaluates its training tasks with a
# policy the spec cannot name (docs/guides/recipe.md); every other example validates with --strict
WARNS = {"libero_spatial_4x80.yaml": ["eval-without-policy", "eval-on-train-tasks"]}


@pytest.mark.parametrize("path", _examples(), ids=lambda p: p.name)
def test_every_example_validates(path):
    args = _set_args(path) if path.name.endswith(".j2") else []
    if path.name.endswith(".j2"):
        assert args, f"{path.name}: a template's first line must give its --set values"
    result = run("validate", path, *([] if path.name in WARNS else ["--strict"]), *args)
    assert result.exit_code == 0, result.output
    assert f"{path}: valid" in result.output
    assert re.findall(r" warning ([a-z-]+) ", result.output) == WARNS.get(path.name, [])
    plan = run("plan", path, "--format", "json", *args)
    assert plan.exit_code == 0, plan.output
    assert json.loads(plan.stdout)["coverage"]["groups"]["incomplete"] == []


def test_template_variables_reach_the_plan():
    path = EXAMPLES / "libero_template.yaml.j2"
    plan = json.loads(run("plan", path, "--format", "json", "--set", "subcollectors=2", "--set", "workers=40").stdout)
    assert plan["name"] == "libero-libero_spatial-2x40"
    assert [s["num_workers"] for s in plan["subcollectors"]] == [40, 40]
    assert plan["spec"]["variables"] == {"subcollectors": "2", "workers": "40"}
    assert [s["render_gpu"] for s in plan["subcollectors"]] == [0, 1]


def test_a_folder_holding_another_topo_does_not_shadow_this_one(tmp_path):
    """Run from a folder with a topo/ of its own: the command and the children it starts (doctor's probes)
    import this topo, not that one."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "topo").mkdir()
    (tmp_path / "topo" / "__init__.py").write_text("raise SystemExit('the wrong topo')\n")
    script = str(Path(sys.executable).parent / "topo")
    spec = str(EXAMPLES / "toy_2x3.yaml")
    for args in (["validate", spec], ["plan", spec, "--dry-run", "--limit", "0"], ["doctor", spec]):
        result = subprocess.run([script, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0 and "wrong topo" not in result.stdout + result.stderr, (args, result.stdout)
