"""Files from elsewhere never run code: hostile run directories, steps, actions files and checkpoints are
refused, exit 2, the file (and line) named, no traceback, and the marker an evil pickle would create absent.

The cases (tests/launch/hostile_files.py) go through the CLI in this process; the issue's two crafted files
(an episode record with an evil seed-state blob, an evil ``torch.save`` checkpoint) through the real CLI in
a fresh process each.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from topo.cli import main
from topo.errors import RecordError

from tests import preimported
from tests.launch.hostile_files import EPISODE, cases, evil_checkpoint, evil_pickle, make, record_run
from tests.launch.launch_helpers import subprocess_env, toy_spec, write

NAMES = [case.name for case in cases(Path("unused"))]  # each test makes its cases with a marker of its own


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return record_run(tmp_path_factory.mktemp("recorded"))


def test_the_recorded_run_replays_bit_for_bit(base):
    result = CliRunner().invoke(main, ["replay", str(base), EPISODE])
    assert result.exit_code == 0 and "every step identical to the recording" in result.output, result.output


@pytest.mark.parametrize("name", NAMES)
def test_a_hostile_run_file_is_refused(name, base, tmp_path):
    marker = tmp_path / "ran"
    (case,) = [c for c in cases(marker) if c.name == name]
    argv = make(case, base, tmp_path)
    result = CliRunner().invoke(main, argv)
    out = result.output
    assert isinstance(result.exception, SystemExit) and result.exit_code == 2, (out, result.exception)
    assert out.startswith("error: ") and "Traceback" not in out, out
    for piece in case.says:
        assert piece in out, out
    assert not marker.exists()


def test_a_checkpoint_that_is_not_weights_is_refused_and_never_run(tmp_path):
    import torch

    from topo.launch.checkpoint import into, load

    marker = tmp_path / "ran"
    policy = torch.nn.Linear(2, 2)
    (tmp_path / "raw.pkl").write_bytes(evil_pickle(marker))
    torch.save(policy, tmp_path / "module.pt")
    torch.save({"weight": torch.zeros(1)}, tmp_path / "misfit.pt")
    (tmp_path / "junk.pt").write_bytes(b"\x00" * 100)
    refused = {
        str(evil_checkpoint(marker, tmp_path / "evil.pt")): "its pickle calls posix.system",
        str(tmp_path / "raw.pkl"): "not a checkpoint torch.save wrote (a pickle that names posix.system)",
        str(tmp_path / "module.pt"): "its pickle calls torch.nn.modules.linear.Linear",
        str(tmp_path / "junk.pt"): "not a checkpoint torch.save wrote",
        str(tmp_path / "misfit.pt"): "its weights do not fit the policy",
    }
    for path, says in refused.items():
        with pytest.raises(RecordError) as caught:
            into(policy, path)
        assert caught.value.exit_code == 2 and str(caught.value).startswith(f"{path}: ") and says in str(caught.value)
    assert not marker.exists()
    torch.save(policy.state_dict(), tmp_path / "state.pt")
    into(policy, str(tmp_path / "state.pt"))
    from tensordict import TensorDict

    torch.save(TensorDict.from_module(policy).data, tmp_path / "td.pt")
    assert isinstance(load(str(tmp_path / "td.pt")), TensorDict)


def test_the_issues_crafted_record_is_refused_by_the_real_cli(base, tmp_path):
    marker = tmp_path / "ran"
    (case,) = [c for c in cases(marker) if c.name == "seed-state-numpy-evil-pickle"]
    done = preimported.run([sys.executable, "-m", "topo", *make(case, base, tmp_path)], capture_output=True, text=True,
                           env=subprocess_env(), timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "its numpy state is a pickle, which topo never unpickles" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 2, done.stderr  # the error and its hint
    assert not marker.exists()


def test_the_issues_crafted_checkpoint_is_refused_by_the_real_cli(tmp_path):
    marker = tmp_path / "ran"
    spec = toy_spec(1, 1)
    spec["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16,
                                                                          "state_dim": 8}}
    spec["eval"] = {"tasks": [0], "trials": 1, "workers": 1, "max_episode_steps": 4}
    evil = evil_checkpoint(marker, tmp_path / "evil.pt")
    done = preimported.run([sys.executable, "-m", "topo", "eval", str(write(tmp_path / "eval.yaml", spec)), "--weights",
                           str(evil)], capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"error: {evil}: a checkpoint that holds more than weights: its pickle calls posix.system" in done.stderr
    assert not marker.exists() and "env workers" not in done.stdout  # refused before any process started
