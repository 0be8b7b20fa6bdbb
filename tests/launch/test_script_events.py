"""The test scripts' event lines (``script_events``): read where another thread's text began the line."""
from __future__ import annotations

import io
import sys

from tests.launch.script_events import emit, parse


class Writes(io.StringIO):
    def __init__(self):
        super().__init__()
        self.calls = []

    def write(self, text):
        self.calls.append(text)
        return super().write(text)


def test_an_event_is_one_write_and_is_read_after_a_line_it_interrupted(monkeypatch):
    out = Writes()
    monkeypatch.setattr(sys, "stdout", out)
    out.write("(NodeCollector pid=4242) A worker died")  # Ray's print: its text, then (later) its newline
    emit(event="killed", pid=7)
    out.write("\n")
    emit(event="after", report={"ok": False})
    assert out.calls[1] == '{"event": "killed", "pid": 7}\n'
    assert list(parse(out.getvalue())) == [{"event": "killed", "pid": 7}, {"event": "after", "report": {"ok": False}}]
    assert list(parse(["not an event {}\n", '{"event": "ready"}\n'])) == [{"event": "ready"}]
