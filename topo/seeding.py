"""The global RNGs of every process of a run, seeded from the plan: a run with the same plan acts the same.

A plan gives each worker row a seed (``assignment.seeds``); everything else a run draws from is derived from
seeds the plan holds, with :class:`numpy.random.SeedSequence` (independent streams, one per role):

- an env worker: from its row's seed (the env's own ``set_seed`` gets the row's seed itself);
- a subcollector (where its policy samples, e.g. ``torch.randn``): from its rows' seeds, so a restart,
  whose rows carry the restart's seeds (:mod:`.restarts`), draws a stream of its own, as reproducible;
- the inference server: from every training row's seed;
- the trainer: :func:`trainer_seed`, for a training script to seed itself with (topo leaves the trainer's
  generators as they were).

A plan without seeds (every row's seed None) seeds nothing: the processes draw from what torch, numpy and
``random`` chose at their start.
"""
from __future__ import annotations

import random
from typing import Any, Iterable

ROLES = {"worker": 1, "subcollector": 2, "server": 3, "trainer": 4}  # the spawn key of each role's stream


def derive(seeds: Iterable[int | None], role: str) -> int | None:
    """A 64-bit seed for ``role`` from ``seeds`` (None when none is set): same seeds, same value."""
    import numpy as np

    given = [int(s) & (2**64 - 1) for s in seeds if s is not None]
    if not given:
        return None
    state = np.random.SeedSequence(given, spawn_key=(ROLES[role],)).generate_state(2, np.uint32)
    return int(state[0]) | int(state[1]) << 32


def seed_globals(seed: int | None) -> None:
    """Seed this process's torch, numpy and ``random`` global generators (nothing when ``seed`` is None)."""
    if seed is None:
        return
    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def row_seeds(plan: dict[str, Any]) -> list[int | None]:
    """Every training row's seed, in global order."""
    return [row["seed"] for sub in plan["subcollectors"] for row in sub["workers"]]


def trainer_seed(plan: dict[str, Any]) -> int | None:
    """The seed a training script gives its own generators (``torch.manual_seed``): derived from the plan's rows."""
    return derive(row_seeds(plan), "trainer")
