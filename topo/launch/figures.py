"""The run's figures in a torchrl logger (``topo.collector(spec, logger=CSVLogger("run", log_dir))``, or any
``torchrl.record.loggers`` logger: TensorBoard, W&B, MLflow), beside the training curves already there.

A thread in the trainer reads the run directory every ``every_s`` seconds as ``topo top`` does
(:mod:`topo.runtime.live`: no call into the collector, nothing on its path) and logs, at step = frames collected:
``topo/frames_per_s``, ``topo/batch_s`` (seconds per subcollector batch), ``topo/batches`` (the collector's),
``topo/restarts``, ``topo/recycles``, ``topo/rss_mb_mean`` and ``_max``, ``topo/step_rate_mean``,
``topo/workers_attention`` and ``topo/policy_version``; and once per evaluation round, at its policy version,
``topo/eval/success_rate``, its interval (``_ci_low``, ``_ci_high``) and ``topo/eval/task_<id>/success_rate``. A last
reading at the end.
"""
from __future__ import annotations

import os
import threading
from typing import Any

from topo.runtime.live import Reader, View, view

EVERY_S = 10.0


class Figures:
    """Logs a run's figures to ``logger`` (its ``log_scalar(name, value, step)``) every ``every_s`` seconds."""

    def __init__(self, logger: Any, run_dir: str, every_s: float = EVERY_S):
        self.logger = logger
        self.reader = Reader(run_dir)
        self.every_s = every_s
        self.previous: View | None = None
        self.rounds = 0  # evaluation rounds logged
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="topo-figures", daemon=True)

    def start(self) -> Figures:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop the thread, then log the last reading."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.log()

    def log(self, now: float | None = None) -> None:
        """Read the run directory and log what it shows now (nothing once it is removed)."""
        if not os.path.isdir(self.reader.run.path):
            return
        snap = self.reader.read(now)
        current = view(snap, self.previous)
        for name, value in scalars(current, self.previous, len(snap.plan["subcollectors"])).items():
            self.logger.log_scalar(f"topo/{name}", value, step=current.header["frames"])
        for r in snap.evaluations[self.rounds:]:
            self._round(r)
        self.previous = current

    def _round(self, r: dict) -> None:
        step = r.get("policy_version") if r.get("policy_version") is not None else r.get("round")
        found = {"eval/success_rate": r.get("success_rate")}
        low, high = (r.get("ci95") or [None, None])[:2]
        found.update({"eval/success_rate_ci_low": low, "eval/success_rate_ci_high": high})
        for task in r.get("tasks") or []:
            found[f"eval/task_{task.get('task_id')}/success_rate"] = task.get("success_rate")
        for name, value in found.items():
            if value is not None:
                self.logger.log_scalar(f"topo/{name}", value, step=step)
        self.rounds += 1

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.log()
            except (OSError, ValueError):  # a record replaced while read: the next reading has it
                continue


def scalars(current: View, previous: View | None, subcollectors: int) -> dict[str, float]:
    """The figures of one reading (those known: a rate needs two readings or a batch); ``batch_s``: the mean time
    between two batches of a subcollector since the reading before."""
    h, rows = current.header, current.rows
    out: dict[str, float | None] = {
        "frames_per_s": h["frames_per_s"], "batches": h["batches"], "restarts": h["restarts"],
        "recycles": h["recycles"], "workers_attention": len(current.attention), "policy_version": h["policy_version"]}
    if previous is not None and h["delivered"] > previous.header["delivered"]:
        out["batch_s"] = (h["at"] - previous.header["at"]) * subcollectors / (h["delivered"] -
                                                                              previous.header["delivered"])
    rss = [r["rss_mb"] for r in rows if r["rss_mb"] is not None]
    if rss:
        out.update(rss_mb_mean=sum(rss) / len(rss), rss_mb_max=max(rss))
    rates = [r["step_rate"] for r in rows if r["step_rate"] is not None]
    if rates:
        out["step_rate_mean"] = sum(rates) / len(rates)
    return {k: float(v) for k, v in out.items() if v is not None}
