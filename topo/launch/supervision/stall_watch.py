"""The stall watchdog in the monitor's thread (``launch.stall_timeout``): the rule is :func:`topo.runtime.stall.find`.

Every :data:`SCAN_S` while the run collects, it reads each subcollector's latest batch (its ``observed/``
record) and heartbeat slots. The clock starts when the run collects and again while a subcollector starts
over (a restart or a recycle is no stall: ``restart-timeout`` bounds it). A stall is named once on stderr
and as an ``events/stall`` record (:mod:`topo.runtime.events`), again only after a batch came out; with
``launch.on_stall: fail`` it is the run's failure (:func:`topo.launch.supervision.failure.stalled`). Imports no torch.
"""
from __future__ import annotations

import sys
from typing import TextIO

from topo.runtime import events, stall
from topo.runtime import heartbeat
from topo.launch.supervision import failure
from topo.launch.supervision.state import RunState

SCAN_S = 1.0  # records and heartbeats read this often: a stall is named within stall_timeout + this


class StallWatch:
    """One run's watchdog; :meth:`check` from the monitor's tick while the run collects."""

    def __init__(self, state: RunState, timeout: float, fail: bool, stream: TextIO | None = None):
        self.state = state
        self.timeout = timeout
        self.fail = fail
        self.stream = stream
        self.since: float | None = None  # the clock's start: collecting, or the last subcollector ready again
        self.named_after: float | None = None  # the last batch time before the stall named last
        self._scanned = 0.0

    @classmethod
    def of(cls, state: RunState) -> StallWatch | None:
        timeout = state.plan["launch"].get("stall_timeout")
        return cls(state, timeout, state.plan["launch"].get("on_stall") == "fail") if timeout else None

    def check(self, now: float) -> failure.Failure | None:
        """The run's failure when it stalled and the spec says fail; else None (a stall is named, once)."""
        if now - self._scanned < SCAN_S:
            return None
        self._scanned = now
        subs = self.state.subcollectors
        if self.since is None or any(s.pending or (s.restart and not s.ready) for s in subs.values()):
            self.since = now
            return None
        batches = {c: (s.observed or {}).get("time") for c, s in subs.items()}
        beats = {}
        for c, s in subs.items():
            slots = heartbeat.read(self.state.run.path, c, s.restart) if s.local else None
            if slots:
                beats[c] = slots
        found = stall.find(self.state.plan, self.since, batches, beats, self.timeout, now)
        last = max([self.since, *(t for t in batches.values() if t is not None)])
        if found is None or self.named_after == last:
            return None
        self.named_after = last
        events.record(self.state.run, "stall", **found.to_dict(), fail=self.fail)
        if self.fail:
            return failure.stalled(found, now)
        print(f"topo: warning: the run stalled: {found.describe()}", file=self.stream or sys.stderr, flush=True)
        return None
