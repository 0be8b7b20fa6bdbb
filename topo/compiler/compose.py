"""Compose YAML text into nodes, after measuring what it would expand to.

``yaml.compose`` recurses once per nesting level, and aliases share their anchor's node, so a few
hundred bytes of anchors of anchors become billions of nodes once built into Python data. Before
composing, one pass over the parser's events (a loop, no recursion, no nodes kept) counts every node
at the size it expands to (an alias adds its anchor's whole subtree, known from when the anchor
closed, so counting is linear) and the depth it reaches (an alias adds its anchor's height). Past a
limit, the pass goes on counting to the end, so the diagnostic says how far past the input goes.
"""
from __future__ import annotations

from dataclasses import dataclass

import yaml

from topo.diagnostics import Diagnostic
from topo.errors import SpecError
from topo.compiler.limits import MAX_DEPTH, MAX_NODES, count

PARSER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader  # libyaml: fast, linear at any depth
COUNT_CAP = 10**18  # past a limit, counts stop growing here (anchors of anchors grow exponentially)
COUNT_DEPTH = 1000  # and the pass stops at this depth (libyaml's own nesting limit)
SMALLER = "give counts and ranges (workers_per_subcollector: 64, tasks: 0-9) rather than one entry per worker"
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def compose(text: str, file: str) -> yaml.Node | None:
    """The node of the single YAML document in ``text`` (None when it holds none).

    Raises :class:`SpecError` past :data:`~topo.compiler.limits.MAX_NODES` (``yaml-alias-expansion`` when an
    alias passed it, else ``spec-too-large``) or :data:`~topo.compiler.limits.MAX_DEPTH` (``spec-too-deep``),
    and ``yaml.YAMLError`` on a syntax error.
    """
    _Measure(file).run(text)
    return yaml.compose(text, Loader=PARSER)  # at most MAX_DEPTH levels of its recursion


@dataclass
class _Passed:
    """Where a limit was first passed, and whether an alias passed it."""

    mark: object
    alias: bool


class _Measure:
    def __init__(self, file: str):
        self.file = file
        self.nodes = 0  # so far, aliases at their expanded size
        self.deepest = 0
        self.too_many: _Passed | None = None
        self.too_deep: _Passed | None = None

    def run(self, text: str) -> None:
        anchors: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, height) it expands to
        stack: list[list] = []  # open collections: [nodes before it, its depth, deepest depth inside, anchor]
        events = yaml.parse(text, Loader=PARSER)
        try:
            for event in events:
                if isinstance(event, yaml.ScalarEvent):
                    self._grow(1, len(stack), event, False)
                    if event.anchor is not None:
                        anchors[event.anchor] = (1, 0)
                elif isinstance(event, yaml.AliasEvent):
                    # undefined: compose reports it; inside its own anchor: the build does (yaml-recursive-alias)
                    size, height = anchors.get(event.anchor, (1, 0))
                    self._grow(size, len(stack) + height, event, True)
                    if stack:
                        stack[-1][2] = max(stack[-1][2], len(stack) + height)
                elif isinstance(event, _OPEN):
                    stack.append([self.nodes, len(stack) + 1, len(stack) + 1, event.anchor])
                    self._grow(1, len(stack), event, False)
                    if event.anchor is not None:
                        anchors[event.anchor] = (1, 0)
                    if self.deepest >= COUNT_DEPTH:
                        break
                elif isinstance(event, _CLOSE):
                    before, depth, deepest, anchor = stack.pop()
                    if anchor is not None:
                        anchors[anchor] = (self.nodes - before, deepest - depth + 1)
                    if stack:
                        stack[-1][2] = max(stack[-1][2], deepest)
        except yaml.YAMLError as exc:
            if "maximum nesting depth" in str(exc):  # libyaml's own limit, met while scanning ahead
                self.deepest = max(self.deepest, COUNT_DEPTH)
                self.too_deep = self.too_deep or _Passed(exc.problem_mark, False)
            if self.too_many is None and self.too_deep is None:
                raise
            self._refuse(complete=False)  # the limit passed says more than a syntax error further on
        finally:
            events.close()
        if self.too_many is not None or self.too_deep is not None:
            self._refuse(complete=not stack)

    def _grow(self, size: int, depth: int, event, alias: bool) -> None:
        self.nodes = min(self.nodes + size, COUNT_CAP)
        self.deepest = max(self.deepest, depth)
        if self.too_many is None and self.nodes > MAX_NODES:
            self.too_many = _Passed(event.start_mark, alias)
        if self.too_deep is None and depth > MAX_DEPTH:
            self.too_deep = _Passed(event.start_mark, alias)

    def _refuse(self, complete: bool) -> None:
        out = []
        if self.too_deep is not None:
            levels = count(self.deepest) if complete else f"at least {count(self.deepest)}"
            how = "with this alias, the spec nests" if self.too_deep.alias else "the spec nests"
            out.append(self._at(self.too_deep.mark, "spec-too-deep", f"{how} {levels} levels deep (limit {MAX_DEPTH})",
                                "a topology spec needs fewer than 10 levels: flatten it"))
        if self.too_many is not None:
            total = f"more than {count(COUNT_CAP)}" if self.nodes >= COUNT_CAP else (
                count(self.nodes) if complete else f"at least {count(self.nodes)}")
            if self.too_many.alias:
                out.append(self._at(
                    self.too_many.mark, "yaml-alias-expansion",
                    f"aliases expand the spec to {total} nodes (limit {count(MAX_NODES)}); this alias passes the limit",
                    "each alias copies its anchor's whole subtree, so anchors of anchors multiply: write the values out"))
            else:
                out.append(self._at(self.too_many.mark, "spec-too-large",
                                    f"the spec has {total} YAML nodes (limit {count(MAX_NODES)})", SMALLER))
        raise SpecError(out)

    def _at(self, mark, code: str, message: str, hint: str) -> Diagnostic:
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        return Diagnostic(code, "error", message, (), hint, self.file, line, column)
