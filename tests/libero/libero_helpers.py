"""Helpers for the LIBERO tests (files that need the package skip themselves where it is missing)."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

HAS_LIBERO = importlib.util.find_spec("libero") is not None
needs_libero = pytest.mark.skipif(not HAS_LIBERO, reason="LIBERO is not installed (pip install 'topo[libero]')")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: its env vars and imports stay out of the test process."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MUJOCO_", "PYOPENGL_", "LIBERO_"))}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT, stdin=subprocess.DEVNULL)
