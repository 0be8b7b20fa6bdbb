"""Bounds on every input (spec files, rendered templates, saved plans, run records), far above any real topology.

A spec is input and plans travel between people and machines: a few hundred bytes of YAML aliases,
or a few thousand nested brackets, must be refused in milliseconds with a message, not expanded
until the machine runs out of memory or Python runs out of stack. Each limit is checked before the
work it bounds (file size before reading, nodes and depth while composing, template steps while
rendering), so refusing costs little more than reading the input up to the point it went past.
"""
from __future__ import annotations

MAX_SPEC_BYTES = 8 * 1024 * 1024
"""Bytes of a spec file, and characters of a rendered template. A 10,000-worker spec with its own
block (task, workers, instruction) and seed for every worker is 0.7 MB; the examples are under 2 KB."""

MAX_NODES = 250_000
"""YAML nodes of a spec (keys, values and items), aliases counted at the size they expand to. That
10,000-worker spec has 80,000; the examples under 150. Validating a spec just under the limit (35,000
one-worker blocks) takes about 3 s and 150 MB (benchmarks/hostile.py): what one can cost at most."""

MAX_DEPTH = 100
"""Nested mappings and lists in a spec. A spec's own shape is at most 6 deep; env kwargs add their own.
Python's recursion limit (1,000 frames) is well above what 100 levels need at every stage."""

MAX_TEMPLATE_STEPS = 10_000_000
"""Work a Jinja2 template may do while rendering: loop iterations, plus the items each filter, range
or method call goes through. A template that loops over 10,000 workers with a few filters takes
well under 100,000."""

MAX_PLAN_BYTES = 256 * 1024 * 1024
"""Bytes of a saved plan. A LIBERO plan takes about 1.1 KB per worker: a 10,000-worker plan is 11 MB,
and 256 MiB holds more than 200,000 workers."""

MAX_PLAN_DEPTH = MAX_DEPTH + 8
"""Nesting of a saved plan: a row's ``kwargs.env`` sits 7 levels down and holds the spec's env kwargs."""

MAX_TASK_IDS = 1_000_000
"""Task ids that the task ranges of a spec name in all (``0-7`` is 8). Workers cycle through the tasks,
so more ids than the largest topology has workers (1,000,000) can never all be used."""

MAX_EVAL_EPISODES = 100_000
"""Episodes of one evaluation (eval tasks x init states x trials), counted before any is listed. LIBERO-90's
90 tasks x 50 init states, 20 times each, is 90,000. A plan lists each episode twice (its row, and the
schedule its env worker reads), about 500 bytes in all: 88,000 LIBERO-90 episodes made a 44 MB plan in 7 s
and 370 MB (sequence seeds), well within MAX_PLAN_BYTES."""

MAX_SUBCOLLECTOR_IDS = 4 * 4096
"""Subcollector ids that the ranges of ``placement.overrides`` name in all: four times the largest
topology's 4,096 subcollectors."""

MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Bytes of one line of a run's episode records (``episodes/*.jsonl``), and of one seed-state blob. A start
record holds the seed state's new blobs: the toy env's whole seed state takes 21 KB in base64
(benchmarks/seed_state_codec.py), an env's tensors at most 64 Ki elements each (``topo.envs.recording.MAX_TENSOR``)."""

MAX_STEPS_BYTES = 256 * 1024 * 1024
"""Bytes of one chunk of recorded steps (16 steps' actions, rewards and digests: a few KB), read back
uncompressed; and of an ``--actions`` file's arrays."""


def count(n: int) -> str:
    """``1234567`` as ``1,234,567``."""
    return f"{n:,}"
