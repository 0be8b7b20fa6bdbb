"""Every ``bash`` and ``python`` block of README.md and docs/ runs and exits 0 (docs/contributing.md).

Each runs in a scratch directory that links the checkout's top-level files and folders, so that
``examples/...`` paths work as in the repository root and whatever a block writes (``plan.json``,
``runs/``) stays out of the checkout; with the virtual environment's ``bin`` first on PATH and the
checkout on PYTHONPATH. One test per block, its id the file and line of its opening fence.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.docs.blocks import ROOT, all_blocks

TIMEOUT_S = 120
RUN = [b for b in all_blocks() if b.runs]


def _scratch(tmp_path):
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv") and not entry.name.startswith("."):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def _env():
    env = dict(os.environ)
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = os.pathsep.join([str(ROOT / ".venv" / "bin"), bin_dir, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("MUJOCO_GL", "egl")
    env.pop("COLUMNS", None)
    return env


def test_some_blocks_run():
    assert len(RUN) >= 3, [b.id for b in RUN]


@pytest.mark.parametrize("block", RUN, ids=[b.id for b in RUN])
def test_block_runs(block, tmp_path):
    """A block as the page shows it, in a fresh process; those that launch (README's training loop: toy 2 x 3, its
    processes started and torn down) take a minute or more here."""
    cwd = _scratch(tmp_path)
    if block.language == "bash":
        command = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        command = [sys.executable, "-c", block.code]
    try:
        done = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"{block.id}: still running after {TIMEOUT_S}s; show it as a console block, or make it "
                    f"cheaper\n{err.stdout or ''}{err.stderr or ''}")
    assert done.returncode == 0, (f"{block.id}: exit {done.returncode}\n--- code\n{block.code}--- stdout\n"
                                  f"{done.stdout[-4000:]}--- stderr\n{done.stderr[-4000:]}")
