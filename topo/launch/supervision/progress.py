"""Live progress on stderr while a run starts and shuts down (one rewritten line, TTY only)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

from topo.launch.supervision.state import Phase, RunState


class Progress:
    """Renders at most every ``interval`` seconds; silent unless enabled and ``stream`` is a TTY."""

    def __init__(self, enabled: bool, stream: TextIO = sys.stderr, interval: float = 0.5, collecting: bool = False):
        self.stream = stream
        self.enabled = enabled and stream.isatty()
        self.collecting = collecting  # also while collecting (the CLI; a training script prints its own)
        self.interval = interval
        self._last = 0.0
        self._shown = False

    def update(self, state: RunState) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._last < self.interval:
            return
        if state.phase is Phase.COLLECTING and not self.collecting:
            self.finish()
            return
        self._last = now
        self._shown = self._write("\r\x1b[K" + line(state))

    def finish(self) -> None:
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = False

    def _write(self, text: str) -> bool:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:  # the terminal went away (SIGHUP follows): progress stops, the launch goes on
            self.enabled = False
        return self.enabled


def line(state: RunState) -> str:
    """E.g. ``starting 12.3s | sub0 3/3 | sub1 1/3 | slowest sub1/w2 8.1s (pid 123)``."""
    now = time.time()
    parts = [f"{state.phase.value} {state.elapsed(now):.1f}s"]
    if state.phase is Phase.STARTING:
        for sub in state.plan["subcollectors"]:
            built = sum(1 for w in state.workers.values() if w.subcollector == sub["index"] and w.constructed)
            parts.append(f"sub{sub['index']} {built}/{sub['num_workers']}")
        building = [w for w in state.workers.values() if w.started and not w.constructed]
        if building:
            slow = min(building, key=lambda w: w.started)
            parts.append(f"slowest sub{slow.subcollector}/w{slow.index} {now - slow.started:.1f}s (pid {slow.pid})")
    else:
        built = sum(1 for w in state.workers.values() if w.constructed)
        closed = sum(1 for w in state.workers.values() if w.closed)
        parts.append(f"{built}/{len(state.workers)} envs built, {closed} closed")
    return "topo: " + " | ".join(parts)
