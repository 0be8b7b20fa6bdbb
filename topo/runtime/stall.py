"""The stall watchdog's rule (``launch.stall_timeout``): no batch for that long while one is owed, and who to name.

A subcollector owes a batch when it was asked for one (or began a rollout) and has not delivered it: slot 0 of
its heartbeat file (:mod:`topo.runtime.heartbeat`); without a file to read (a Ray node's) it is taken to owe one. A
trainer that asks for nothing (it trains, it evaluates) is never stalled. When the run stalls, the verdict
names the subcollectors that delivered nothing within the timeout and the workers that ended no env step
within it, with their plan rows: a worker that is slow but steps is never named. Pure and torch-free: the
monitor (:mod:`topo.launch.supervision.monitor`) asks it while the run collects, ``topo top`` on the records it reads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

SHOWN = 8  # workers named in a message (all are in the verdict)


@dataclass(frozen=True)
class Stall:
    """No batch for ``seconds`` (``timeout`` allowed): ``silent`` subcollectors delivered none within the timeout;
    ``idle`` workers (their plan rows, with ``idle_s``: since their last step ended, None: never) ended no step."""

    seconds: float
    timeout: float
    silent: list[int]
    idle: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        """E.g. ``no batch for 12.3s (launch.stall_timeout 10s): subcollectors 0, 1 delivered nothing; 2 of 4
        workers ended no env step in 10s: sub0/w0 (row 0, task 0, "push left") idle 11.8s; ...``."""
        subs = ", ".join(map(str, self.silent)) or "none"
        text = f"no batch for {self.seconds:.1f}s (launch.stall_timeout {self.timeout:g}s): subcollectors {subs} " \
               f"delivered nothing"
        if not self.idle:
            return text + "; every worker steps (the batches do not come out of the subcollectors)"
        names = [worker_text(w) for w in self.idle[:SHOWN]]
        if len(self.idle) > SHOWN:
            names.append(f"... and {len(self.idle) - SHOWN} more")
        return text + f"; {len(self.idle)} worker(s) ended no env step in {self.timeout:g}s: " + "; ".join(names)

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "timeout": self.timeout, "silent_subcollectors": self.silent,
                "idle_workers": self.idle}


def worker_text(w: Mapping[str, Any]) -> str:
    """``sub0/w1 (row 1, task 0, "push left") idle 11.8s``."""
    what = [f"row {w.get('global_index')}"]
    if w.get("task_id") is not None:
        what.append(f"task {w['task_id']}")
    if w.get("instruction"):
        what.append(f'"{cut(str(w["instruction"]), 40)}"')
    idle = "never stepped" if w.get("idle_s") is None else f"idle {w['idle_s']:.1f}s"
    return f"sub{w['subcollector']}/w{w['worker']} ({', '.join(what)}) {idle}"


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def find(plan: Mapping[str, Any], since: float, batches: Mapping[int, float | None],
         beats: Mapping[int, list[tuple[float, float]]], timeout: float, now: float) -> Stall | None:
    """The stall at ``now``, or None. ``since``: when the clock started (the run collects, a restart is ready);
    ``batches``: each subcollector's latest batch time (None: none yet); ``beats``: each subcollector's heartbeat
    slots ``(started, ended)`` (slot 0 its own, ``1 + w`` worker ``w``'s) where they can be read."""
    last = max([since, *(t for t in batches.values() if t is not None)])
    if now - last <= timeout:
        return None
    subs = plan["subcollectors"]
    owed = [sub["index"] for sub in subs if sub["index"] not in beats or _owes(beats[sub["index"]])]
    if not owed:
        return None
    silent = [sub["index"] for sub in subs if (batches.get(sub["index"]) or since) < now - timeout]
    idle = []
    for sub in subs:
        slots = beats.get(sub["index"])
        if slots is None:
            continue
        for row in sub["workers"]:
            ended = slots[row["index"] + 1][1] if row["index"] + 1 < len(slots) else 0.0
            if now - ended > timeout:
                idle.append({"subcollector": sub["index"], "worker": row["index"],
                             "global_index": row.get("global_index"), "task_id": row.get("task_id"),
                             "instruction": row.get("instruction"), "idle_s": round(now - ended, 3) if ended else None})
    return Stall(now - last, timeout, silent, idle)


def _owes(slots: list[tuple[float, float]]) -> bool:
    return bool(slots) and slots[0][0] > slots[0][1]
