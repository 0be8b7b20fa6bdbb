"""Python child processes that import this topo, whatever their working directory.

``python -c`` puts the working directory first on ``sys.path``: started from a folder that holds another
``topo/``, the child would import that one. :func:`command` puts the folder holding this topo there instead.
"""
from __future__ import annotations

import os
import sys

#: the folder that holds this ``topo`` package
HOME = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def command(code: str, *args: str) -> list[str]:
    """``python -c CODE ARGS...`` that runs ``code`` with this topo importable first; ``sys.argv[1:]`` is ``args``."""
    return [sys.executable, "-c", f"import sys; sys.path[0] = {HOME!r}; {code}", *args]
