"""topo.runtime.gl: with MUJOCO_GL=egl, a process that imports torchrl but builds no env loads no GL library, and an
env worker gets the user's setting back before its builder runs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from topo.runtime import gl

PROBE = """
import json, os, sys
from topo.runtime import gl
if {hold}:
    gl.hold()
import torchrl.envs  # imports mujoco
before = gl.loaded_libraries()
{after}
print(json.dumps({{"before": before, "after": gl.loaded_libraries(), "MUJOCO_GL": os.environ.get("MUJOCO_GL"),
                  "held": os.environ.get(gl.HELD_VAR), "mujoco.egl": "mujoco.egl" in sys.modules}}))
"""


def probe(hold: bool, after: str = "", **env: str | None) -> dict:
    environ = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    proc = subprocess.run([sys.executable, "-c", PROBE.format(hold=hold, after=after)], env=environ,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize("hold, loads_egl", [(False, True), (True, False)])
def test_importing_torchrl_opens_egl_unless_held(hold, loads_egl):
    seen = probe(hold, MUJOCO_GL="egl", **{gl.HELD_VAR: None})
    assert any(lib.startswith("libEGL") for lib in seen["before"]) is loads_egl
    assert seen["mujoco.egl"] is loads_egl
    assert (seen["MUJOCO_GL"], seen["held"]) == (("disable", "egl") if hold else ("egl", None))


def test_release_gives_the_worker_its_gl_back_when_asked_for():
    after = ("gl.release(); released = gl.loaded_libraries(); import mujoco, mujoco.renderer\n"
             "assert mujoco.GLContext is mujoco.gl_context.GLContext is sys.modules['mujoco.egl'].GLContext\n"
             "assert released == [], released  # no display until something asks for mujoco's GL context")
    seen = probe(True, after, MUJOCO_GL="egl", **{gl.HELD_VAR: None})
    assert seen["before"] == [] and any(lib.startswith("libEGL") for lib in seen["after"])
    assert (seen["MUJOCO_GL"], seen["held"]) == ("egl", None)


def test_release_leaves_mujoco_gl_unset_when_the_user_had_none():
    seen = probe(True, "gl.release()", MUJOCO_GL=None, **{gl.HELD_VAR: None})
    assert (seen["MUJOCO_GL"], seen["held"]) == (None, None)


def test_a_nested_hold_keeps_the_users_value(monkeypatch):
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.delenv(gl.HELD_VAR, raising=False)
    gl.hold()
    gl.hold()
    assert (os.environ["MUJOCO_GL"], os.environ[gl.HELD_VAR]) == ("disable", "osmesa")
    gl.release()
    assert os.environ["MUJOCO_GL"] == "osmesa" and gl.HELD_VAR not in os.environ
    gl.release()  # nothing held: no change
    assert os.environ["MUJOCO_GL"] == "osmesa"


def test_a_user_who_disabled_gl_gets_a_clear_error_not_a_loop():
    after = ("gl.release(); import mujoco\n"
             "try:\n    mujoco.GLContext\nexcept AttributeError as err:\n    assert 'MUJOCO_GL' in str(err)\n"
             "else:\n    raise SystemExit('a GL context with GL disabled')")
    seen = probe(True, after, MUJOCO_GL="disable", **{gl.HELD_VAR: None})
    assert seen["after"] == [] and seen["MUJOCO_GL"] == "disable"
