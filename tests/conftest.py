"""Every test, and every process a test starts, caches compiled MuJoCo models in one temporary directory
of the session, never in the user's cache; it is deleted at the end (a LIBERO scene's entry is ~260 MB)."""
import os
import shutil

import pytest

from topo.model_cache import CACHE_VAR


@pytest.fixture(scope="session", autouse=True)
def session_model_cache(tmp_path_factory):
    saved = os.environ.get(CACHE_VAR)
    directory = str(tmp_path_factory.mktemp("model-cache"))
    os.environ[CACHE_VAR] = directory
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
    if saved is None:
        os.environ.pop(CACHE_VAR, None)
    else:
        os.environ[CACHE_VAR] = saved
