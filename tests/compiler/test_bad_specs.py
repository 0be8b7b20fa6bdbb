"""A corpus of bad specs: `topo validate` names every problem with its code and file:line, exits 2, never a traceback.

Each file in bad_specs/ says what it expects in its header comments:

    # expect: CODE LINE[, CODE LINE...]   every diagnostic, exactly (LINE '-' when it has no line)
    # args: --set k=v ...                 extra command-line arguments
    # text: ...                           a piece of text the output must contain (repeatable)
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from topo.cli import main

from tests.compiler.compiler_helpers import HERE

BAD = HERE / "bad_specs"


def header(path: Path) -> dict:
    expect, args, text = [], [], []
    for line in path.read_text(encoding="latin-1").splitlines():
        if not line.startswith("#"):
            break
        key, _, value = line[1:].strip().partition(":")
        value = value.strip()
        if key == "expect":
            for item in value.split(","):
                code, line_no = item.split()
                expect.append((code, None if line_no == "-" else int(line_no)))
        elif key == "args":
            args = value.split()
        elif key == "text":
            text.append(value)
    return {"expect": expect, "args": args, "text": text}


def run(*args: str):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result, result.output


def located(output: str, file: str) -> list[tuple[str, int | None]]:
    """(code, line) of every diagnostic printed for ``file``."""
    pattern = re.compile(rf"^{re.escape(file)}(?::(\d+)(?::\d+)?)?: (?:error|warning) ([a-z0-9-]+)\b", re.M)
    return [(m.group(2), int(m.group(1)) if m.group(1) else None) for m in pattern.finditer(output)]


CORPUS = sorted(p for p in BAD.iterdir() if p.is_file())


def test_corpus_size():
    assert len(CORPUS) >= 40
    assert all(header(p)["expect"] for p in CORPUS), [p.name for p in CORPUS if not header(p)["expect"]]


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_bad_spec(path: Path):
    h = header(path)
    result, out = run("validate", path, *h["args"])
    assert "Traceback" not in out, out
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 2, out
    assert Counter(located(out, str(path))) == Counter(h["expect"]), out
    for piece in h["text"]:
        assert piece in out, f"{piece!r} not in:\n{out}"


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_bad_spec_json(path: Path):
    h = header(path)
    result, out = run("validate", path, "--format", "json", *h["args"])
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["ok"] is False
    got = Counter((d["code"], d["line"]) for d in data["diagnostics"])
    assert got == Counter(h["expect"])
    assert all(d["file"] == str(path) and d["severity"] in ("error", "warning") for d in data["diagnostics"])


# --- cases that cannot carry a header --------------------------------------------------------------

def test_empty_file(tmp_path):
    spec = tmp_path / "empty.yaml"
    spec.write_text("")
    result, out = run("validate", spec)
    assert result.exit_code == 2 and "Traceback" not in out
    assert f"{spec}: error empty-spec: the spec is empty" in out


def test_whitespace_only_file(tmp_path):
    spec = tmp_path / "blank.yaml"
    spec.write_text("\n   \n\t\n")
    result, out = run("validate", spec)
    assert result.exit_code == 2
    assert located(out, str(spec)) == [("empty-spec", None)]


def test_directory_as_spec(tmp_path):
    result, out = run("validate", tmp_path)
    assert result.exit_code == 2 and "Traceback" not in out
    assert f"{tmp_path}: error spec-is-directory" in out


def test_missing_file(tmp_path):
    spec = tmp_path / "nope.yaml"
    result, out = run("validate", spec)
    assert result.exit_code == 2 and "Traceback" not in out
    assert f"{spec}: error spec-not-found: no such file: {spec}" in out


def test_not_utf8(tmp_path):
    spec = tmp_path / "latin1.yaml"
    spec.write_bytes(b"version: 1\nname: caf\xe9\n")
    result, out = run("validate", spec)
    assert result.exit_code == 2 and "Traceback" not in out
    assert located(out, str(spec)) == [("spec-encoding", None)]


def test_set_without_equals():
    result, out = run("validate", BAD / "template_undefined.yaml.j2", "--set", "subcollectors")
    assert result.exit_code == 2 and "Traceback" not in out
    assert "error set-syntax: --set expects key=value, got 'subcollectors'" in out


def test_template_with_all_variables_is_valid():
    result, out = run("validate", BAD / "template_undefined.yaml.j2", "--set", "subcollectors=2", "--set", "workers=3")
    assert result.exit_code == 0, out
    assert "valid" in out


# --- warnings: exit 0, or 2 with --strict -----------------------------------------------------------

UNEVEN = """\
version: 1
env: {backend: toy}
topology: {subcollectors: 1, workers_per_subcollector: 5}
assignment:
  tasks: 0-3
"""


def test_uneven_coverage_warns(tmp_path):
    strict_only = BAD / "uneven_coverage_strict.yaml"
    result, out = run("validate", strict_only)
    assert result.exit_code == 0, out
    assert located(out, str(strict_only)) == header(strict_only)["expect"]
    assert f"{strict_only}: valid" in out

    spec = tmp_path / "uneven.yaml"
    spec.write_text(UNEVEN)
    result, out = run("validate", spec)
    assert result.exit_code == 0, out
    assert located(out, str(spec)) == [("task-coverage-uneven", 5)]
    assert "5 workers over 4 tasks is uneven (5 % 4 = 1): task 0 gets 2, the others 1" in out

    result, out = run("validate", spec, "--strict")
    assert result.exit_code == 2
    assert located(out, str(spec)) == [("task-coverage-uneven", 5)]

    data = json.loads(run("validate", spec, "--format", "json")[0].stdout)
    assert data["ok"] is True and [d["severity"] for d in data["diagnostics"]] == ["warning"]
    assert json.loads(run("validate", spec, "--format", "json", "--strict")[0].stdout)["ok"] is False


def test_plan_prints_each_diagnostic_once(tmp_path):
    spec = tmp_path / "uneven.yaml"
    spec.write_text(UNEVEN + "collector: {frames_per_batch: 7}\n")
    result, out = run("plan", spec)
    assert result.exit_code == 2 and "Traceback" not in out
    assert Counter(located(out, str(spec))) == Counter([("task-coverage-uneven", 5), ("frames-per-batch-split", 6)])
    spec.write_text(UNEVEN)
    result, out = run("plan", spec, "--strict")
    assert result.exit_code == 2
    assert located(out, str(spec)) == [("task-coverage-uneven", 5)]
    result, out = run("plan", spec)
    assert result.exit_code == 0
    assert located(out, str(spec)) == [("task-coverage-uneven", 5)]


# --- every problem at once ---------------------------------------------------------------------------

def test_many_problems_at_once_json():
    path = BAD / "many_problems.yaml"
    result, _ = run("validate", path, "--format", "json")
    data = json.loads(result.stdout)
    by_code = {d["code"]: d for d in data["diagnostics"]}
    assert len({d["code"] for d in data["diagnostics"] if d["severity"] == "error"}) >= 4
    assert by_code["group-size-divides-workers"]["path"] == ["topology", "workers_per_subcollector"]
    assert by_code["candidate-size-multiple"]["path"] == ["assignment", "groups", "candidate_size"]
    assert by_code["random-init-with-parallel-groups"]["path"] == ["assignment", "init_states", "mode"]
    assert by_code["seeds-duplicate"]["path"] == ["assignment", "seeds", "list"]
    assert by_code["use-buffers-with-worker-metadata"]["path"] == ["launch", "use_buffers"]
    assert by_code["schema-unknown-key"]["path"] == ["launch", "startup_timout"]
    assert by_code["schema-unknown-key"]["hint"] == "did you mean 'startup_timeout'?"
    assert "6 % 4 = 2" in by_code["group-size-divides-workers"]["message"]
    assert all(d["column"] and d["line"] for d in data["diagnostics"])
    # in document order
    lines = [d["line"] for d in data["diagnostics"]]
    assert lines == sorted(lines)


def test_text_and_json_agree():
    path = BAD / "many_problems.yaml"
    text = run("validate", path)[1]
    data = json.loads(run("validate", path, "--format", "json")[0].stdout)
    for d in data["diagnostics"]:
        where = f"{path}:{d['line']}:{d['column']}: {d['severity']} {d['code']}"
        assert where in text
    assert f"{sum(d['severity'] == 'error' for d in data['diagnostics'])} error(s)" in text

