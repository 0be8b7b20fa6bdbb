"""Every test, and every process a test starts, caches compiled MuJoCo models in one temporary directory
of the session, never in the user's cache (a LIBERO task's entry is ~260 MB)."""
import os

import pytest

from topo.model_cache import CACHE_VAR


@pytest.fixture(scope="session", autouse=True)
def session_model_cache(tmp_path_factory):
    saved = os.environ.get(CACHE_VAR)
    os.environ[CACHE_VAR] = str(tmp_path_factory.mktemp("model-cache"))
    yield os.environ[CACHE_VAR]
    if saved is None:
        os.environ.pop(CACHE_VAR, None)
    else:
        os.environ[CACHE_VAR] = saved
