"""The shipped catalogue of torchrl's transforms is the installed torchrl's, and a change in torchrl shows."""
from __future__ import annotations

import copy
import runpy
import subprocess
import sys

from topo.compiler.transform_catalog import REGENERATE, catalog, differences

from tests.compiler.compiler_helpers import ROOT

SCRIPT = ROOT / "scripts" / "transform-catalog"


def test_the_shipped_catalogue_is_the_installed_torchrls():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"the catalogue is stale, regenerate it with `{REGENERATE}`:\n{done.stdout}{done.stderr}"


def test_it_holds_the_recipes_transforms_and_named_constructors():
    known = catalog()["transforms"]
    assert {"MultiAction", "StepCounter", "SuccessReward", "ActionTokenizerTransform"} <= set(known)
    assert "from_vla" in known["MultiAction"]["constructors"]
    step = {p["name"]: p for p in known["StepCounter"]["params"]}
    assert step["max_steps"] == {"name": "max_steps", "kind": "positional-or-keyword", "required": False,
                                 "default": None, "annotation": "int | None"}


def test_a_renamed_kwarg_is_reported():
    class MultiAction:  # torchrl renaming stack_rewards, as a future release might
        def __init__(self, *, dim: int = 1, stack_reward: bool = True, stack_observations: bool = False,
                     action_key=None, chunk_key=None):
            pass

    params = runpy.run_path(str(SCRIPT), run_name="transform_catalog")["params"]  # what the script reads a class with
    fresh = copy.deepcopy(catalog())
    fresh["transforms"]["MultiAction"]["params"] = params(MultiAction)
    found = differences(catalog(), fresh)
    assert "MultiAction: kwarg 'stack_rewards' is gone" in found
    assert "MultiAction: kwarg 'stack_reward' is new" in found
    assert differences(catalog(), copy.deepcopy(catalog())) == []
