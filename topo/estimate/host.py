"""This host's memory available now: the budget a plan is checked against here (``topo plan --estimate``,
``topo launch``, ``topo doctor``)."""
from __future__ import annotations


def available_gb() -> float:
    """This host's available memory now (MemAvailable), GB."""
    import psutil

    return psutil.virtual_memory().available / 2**30
