"""Where a run's time goes, as pure functions of what it measured (no torch): env steps, the wait for
inference, the server's forward and batch fill, the trainer's time between batches, and a verdict.

The figures come from three places: each env worker times its steps and each subcollector its policy calls
into its heartbeat slot (:mod:`topo.runtime.heartbeat`: a count, a total and a histogram of :data:`BUCKETS` buckets,
:data:`PER_OCTAVE` to an octave from :data:`BASE_S`: a percentile is known within 19 %); the inference
server keeps its own (torchrl's ``stats()``: forward p50/p95, requests per forward); the trainer's loop
times each batch it waits for and the time it takes before asking for the next (:class:`Pace`).

The verdict, for the loop as a whole: **trainer-bound** when the trainer holds the collector at least as
long as the collector takes to collect (its share of the loop >= ``TRAINER_BOUND``); otherwise
**inference-bound** when the subcollectors wait on their policy calls longer than their envs step (each
worker's steps, averaged over a subcollector's workers; in async mode, each worker's own waits for the server
against its steps), else **env-bound**.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

BUCKETS = 64
BASE_S = 1e-4  # bucket 0 holds what takes under 0.1 ms; the last one what takes over ~6.5 s
PER_OCTAVE = 4
TRAINER_BOUND = 0.5  # the trainer's share of the loop from which the run is trainer-bound


def bucket(seconds: float) -> int:
    """The histogram bucket of a duration."""
    if seconds <= BASE_S:
        return 0
    return min(BUCKETS - 1, 1 + int(math.log2(seconds / BASE_S) * PER_OCTAVE))


def bucket_seconds(index: int) -> float:
    """A bucket's representative duration: the geometric middle of its bounds."""
    if index == 0:
        return BASE_S
    return BASE_S * 2 ** ((index - 0.5) / PER_OCTAVE)


def percentile(histogram: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile (0-1) of a histogram's durations, in seconds; None when it counts nothing."""
    total = sum(histogram)
    if not total:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(histogram):
        seen += count
        if count and seen >= rank:
            return bucket_seconds(index)
    return bucket_seconds(len(histogram) - 1)


def merge(histograms: Sequence[Sequence[int]]) -> list[int]:
    """Bucket by bucket sums of histograms."""
    out = [0] * BUCKETS
    for histogram in histograms:
        for index, count in enumerate(histogram):
            out[index] += count
    return out


@dataclass(frozen=True)
class Timed:
    """Durations of one kind (an env worker's steps, a subcollector's policy calls): count, total, histogram."""

    count: int = 0
    seconds: float = 0.0
    histogram: tuple[int, ...] = (0,) * BUCKETS

    def __add__(self, other: Timed) -> Timed:
        return Timed(self.count + other.count, self.seconds + other.seconds,
                     tuple(merge([self.histogram, other.histogram])))

    def figures(self) -> dict[str, Any] | None:
        """Milliseconds: p50, p95, mean, with the count; None when nothing was timed."""
        if not self.count:
            return None
        return {"p50": _ms(percentile(self.histogram, 0.5)), "p95": _ms(percentile(self.histogram, 0.95)),
                "mean": _ms(self.seconds / self.count), "count": self.count}


@dataclass
class Pace:
    """The trainer's loop: per batch, the seconds it waited for it, and the seconds it took before asking for the
    next. Call :meth:`asked` when the trainer asks for a batch and :meth:`got` when it has one."""

    collect: list[float] = field(default_factory=list)
    trainer: list[float] = field(default_factory=list)
    _asked: float | None = None
    _got: float | None = None

    def asked(self, now: float) -> None:
        if self._got is not None:
            self.trainer.append(now - self._got)
        self._asked, self._got = now, None

    def got(self, now: float) -> None:
        if self._asked is not None:
            self.collect.append(now - self._asked)
        self._got, self._asked = now, None

    def figures(self) -> dict[str, Any]:
        """Batches, mean seconds collecting one and between two, and the trainer's share of the loop."""
        collect, trainer = sum(self.collect), sum(self.trainer)
        # a batch being trained on now counts as the trainer's as far as it went: its gap is not closed yet
        return {"batches": len(self.collect), "collect_s": _mean(self.collect), "between_batches_s": _mean(self.trainer),
                "trainer_share": round(trainer / (trainer + collect), 3) if trainer + collect > 0 else None}


def breakdown(subcollectors: Sequence[dict[str, Any]], pace: dict[str, Any] | None,
              server: dict[str, Any] | None) -> dict[str, Any]:
    """The run's time breakdown. ``subcollectors``: per subcollector ``{"subcollector", "workers", "env": Timed
    (its workers' steps, merged), "policy": Timed (its policy calls; with ``"per_worker": True``, its workers' own
    waits for inference, merged: async mode)}``; ``pace``: :meth:`Pace.figures`; ``server``: torchrl's server
    ``stats()`` (None: no server)."""
    rows = []
    env_s = policy_s = 0.0
    for sub in subcollectors:
        env, policy, workers = sub["env"], sub["policy"], max(1, sub["workers"])
        env_s += env.seconds / workers  # the time a worker of it spent stepping
        policy_s += policy.seconds / (workers if sub.get("per_worker") else 1)  # what a worker of it waited
        rows.append({"subcollector": sub["subcollector"], "env_step_ms": env.figures(),
                     "inference_wait_ms": policy.figures()})
    served = None
    if server:
        served = {"forward_ms": {"p50": _round(server.get("p50_forward_ms")), "p95": _round(server.get("p95_forward_ms"))},
                  "queue_ms": {"p50": _round(server.get("p50_queue_ms")), "p95": _round(server.get("p95_queue_ms"))},
                  "requests_per_forward": _round(server.get("avg_batch_size")),
                  "batch_fill": _round((server.get("avg_batch_size") or 0) / max(1, len(subcollectors)), 3)}
    n = max(1, len(rows))
    verdict, line = _verdict(env_s / n, policy_s / n, pace, served)
    return {"subcollectors": rows, "server": served, "trainer": pace, "verdict": verdict, "line": line}


def human(figures: dict[str, Any] | None) -> list[str]:
    """The report's lines: the verdict with its figures, then each subcollector's env step and inference wait."""
    if not figures:
        return []
    out = [f"  time: {figures['line']}"]
    for row in figures.get("subcollectors") or []:
        out.append(f"    sub{row['subcollector']}: env step {_p(row.get('env_step_ms'))}; "
                   f"inference wait {_p(row.get('inference_wait_ms'))}")
    return out


def _p(ms: dict | None) -> str:
    return "not timed" if not ms else f"p50 {ms['p50']:g} ms, p95 {ms['p95']:g} ms ({ms['count']})"


def _verdict(env_s: float, policy_s: float, pace: dict | None, served: dict | None) -> tuple[str | None, str]:
    share = (pace or {}).get("trainer_share")
    trainer = (f"trainer {share:.0%} of the loop ({pace['between_batches_s']} s between batches, "
               f"{pace['collect_s']} s collecting one)" if share is not None else "trainer not timed")
    if share is not None and share >= TRAINER_BOUND:
        return "trainer-bound", f"trainer-bound: {trainer}"
    if env_s <= 0 and policy_s <= 0:
        return None, f"not measured: no env step or policy call timed; {trainer}"
    forward = ""
    if served:
        forward = (f", server forward p50 {served['forward_ms']['p50']} ms at {served['requests_per_forward']} "
                   f"request(s) per forward (fill {served['batch_fill']})")
    figures = (f"a subcollector's env worker stepped {env_s:.2f} s while it waited {policy_s:.2f} s for inference"
               f"{forward}; {trainer}")
    if policy_s > env_s:
        return "inference-bound", f"inference-bound: {figures}"
    return "env-bound", f"env-bound: {figures}"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)
