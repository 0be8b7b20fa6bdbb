"""The test scripts' events: one JSON object per stdout line, written by :func:`emit`, read by :func:`parse`.

A script's stdout is shared: under Ray the driver prints its actors' lines from a thread of its own, as
``print`` does, the text then the newline in two writes, so an event can land after another line's text,
before its newline. An event is therefore written in one write, and read wherever it starts in a line.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Iterable, Iterator

START = '{"event": '  # every event's first key: emit(event=..., ...)
_DECODER = json.JSONDecoder()


def emit(**fields) -> None:
    """Print one event, ``event`` first (``emit(event="ready", ...)``), in a single write."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def rows_arrived(buffer, rows: int, iteration: int, wait_s: float) -> float | None:
    """Wait until a shared replay buffer holds ``rows`` more rows: the wait's start (``time.monotonic()``), or None
    after emitting ``starved`` when it stops filling for ``wait_s`` (the script then ends, named)."""
    target, began = buffer.write_count + rows, time.monotonic()
    while buffer.write_count < target:
        if time.monotonic() - began > wait_s:
            emit(event="starved", iteration=iteration, rows=buffer.write_count)
            return None
        time.sleep(0.05)
    return began


def parse(lines: Iterable[str] | str) -> Iterator[dict]:
    """The events in a script's output (its text, or its lines as they come), in order."""
    for line in lines.splitlines() if isinstance(lines, str) else lines:
        at = line.find(START)
        if at >= 0:
            yield _DECODER.raw_decode(line, at)[0]
