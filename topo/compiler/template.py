"""Render a Jinja2 spec template in a sandbox whose work and output are bounded.

Jinja2's sandbox keeps a template away from Python's internals, not from running long or growing
large: ``{{ "x" * 10**10 }}`` allocates 10 GB, and loops inside loops over ``range(100000)`` run for
hours. Here every loop iteration, and every item that a filter or a call takes or returns, is charged
to a budget (:data:`~topo.compiler.limits.MAX_TEMPLATE_STEPS`); ``*``, ``**``, ``%``, widths and counts are
checked before they run; strings joined with ``+`` or ``~`` and the rendered text are held to
:data:`~topo.compiler.limits.MAX_SPEC_BYTES`.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Iterable, Mapping

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment
from jinja2.visitor import NodeTransformer

from topo.compiler.limits import MAX_SPEC_BYTES, MAX_TEMPLATE_STEPS, count

MAX_INT_BITS = 65_536
"""Bits of an integer a template computes (about 20,000 digits; Python prints at most 4,300)."""

_SIZED = (str, bytes, list, tuple, dict, set, frozenset, range)
_WIDTH_FILTERS = {"center", "indent", "wordwrap", "truncate", "batch", "slice"}  # their numbers size the result


class TemplateLimit(Exception):
    """A template went past a limit. An ``Exception``, so Jinja2's constant folding leaves it to run time."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def render(text: str, variables: Mapping[str, str]) -> str:
    """``text`` rendered with ``variables``; raises :class:`TemplateLimit` or what Jinja2 raises."""
    env = BoundedSandbox()
    out, size = [], 0
    for chunk in env.from_string(text).generate(**variables):
        size += len(chunk)
        if size > MAX_SPEC_BYTES:
            raise TemplateLimit("spec-too-large", f"the template renders more than {count(MAX_SPEC_BYTES)} characters, "
                                                  "the limit")
        out.append(chunk)
    return "".join(out)


class BoundedSandbox(SandboxedEnvironment):
    """:class:`SandboxedEnvironment` with a step budget and bounded values (see the module docstring)."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self):
        super().__init__(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
        self.steps = 0
        self.filters = {name: self._bounded_filter(f) for name, f in self.filters.items()}
        self.filters.update(topo_steps=self._steps, topo_text=self._text)
        del self.globals["lipsum"]  # lipsum(n) writes n paragraphs before anything can count them

    def charge(self, steps: int) -> None:
        self.steps += steps
        if self.steps > MAX_TEMPLATE_STEPS:
            raise TemplateLimit("template-too-long", f"the template runs more than {count(MAX_TEMPLATE_STEPS)} steps "
                                f"(loop iterations, and items through filters and calls; limit "
                                f"{count(MAX_TEMPLATE_STEPS)})")

    def _parse(self, source, name, filename):
        return _Instrument().visit(super()._parse(source, name, filename))

    def _steps(self, items: Iterable) -> Iterable:
        for item in items:
            self.charge(1)
            yield item

    def _text(self, value: Any) -> Any:
        return _within(value, "'~'")

    def _bounded_filter(self, f):
        @functools.wraps(f)  # keeps jinja_pass_arg (pass_context and the like)
        def bounded(*args, **kwargs):
            if name in _WIDTH_FILTERS:
                _no_huge_counts(f"filter {name}", args, kwargs)
            elif name == "format" and args:
                _no_huge_widths(args[0], args[1:])
            self.charge(sum(_size(a) for a in args))
            result = f(*args, **kwargs)
            self.charge(_size(result))
            return _within(result, f"filter {name}")

        name = f.__name__.removeprefix("do_")
        return bounded

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - the sandbox's own signature
        name = getattr(__obj, "__name__", "call")
        owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # the sandbox wraps str.format
        if isinstance(owner, str):  # "x".center(n), .ljust(n), .zfill(n), .expandtabs(n), .format(...)
            _no_huge_counts(f"{name}()", args, kwargs)
            if name in ("format", "format_map"):
                _no_huge_widths(owner, (*args, *kwargs.values()))
        sizes = [_size(a) for a in (*args, *kwargs.values())]
        if _size(owner) and sizes and _size(owner) * max(sizes) > MAX_SPEC_BYTES:
            unit = "characters" if isinstance(owner, str) else "items"
            raise TemplateLimit("template-too-large", f"{name}() on {count(_size(owner))} {unit} with an argument of "
                                f"{count(max(sizes))} could make {count(_size(owner) * max(sizes))} "
                                f"(limit {count(MAX_SPEC_BYTES)})")
        __self.charge(1 + _size(owner) + sum(sizes))
        result = super().call(__context, __obj, *args, **kwargs)
        __self.charge(_size(result))
        return _within(result, f"{name}()")

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, _SIZED) and isinstance(n, int) and len(seq) * n > MAX_SPEC_BYTES:
                    raise TemplateLimit("template-too-large", f"'*' would make {count(len(seq) * n)} items "
                                        f"(limit {count(MAX_SPEC_BYTES)})")
            if isinstance(left, int) and isinstance(right, int):
                _int_bits(left.bit_length() + right.bit_length(), "'*'")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            _int_bits(left.bit_length() * right, "'**'")
        elif operator == "%" and isinstance(left, str):
            _no_huge_widths(left, right if isinstance(right, tuple) else (right,))
        result = super().call_binop(context, operator, left, right)
        self.charge(_size(result))
        return _within(result, f"'{operator}'")


class _Instrument(NodeTransformer):
    """Each ``for`` iterates through the ``topo_steps`` filter, each ``~`` ends in ``topo_text``."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "topo_steps", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        return nodes.Filter(self.generic_visit(node), "topo_text", [], [], None, None, lineno=node.lineno)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, _SIZED) else 0


def _within(value: Any, what: str) -> Any:
    if isinstance(value, _SIZED) and len(value) > MAX_SPEC_BYTES:
        unit = "characters" if isinstance(value, str) else "items"
        raise TemplateLimit("template-too-large", f"{what} made {count(len(value))} {unit} (limit {count(MAX_SPEC_BYTES)})")
    if isinstance(value, int) and not isinstance(value, bool):
        _int_bits(value.bit_length(), what)
    return value


def _int_bits(bits: int, what: str) -> None:
    if bits > MAX_INT_BITS:
        raise TemplateLimit("template-too-large", f"{what} would make an integer of about {count(bits)} bits "
                            f"(limit {count(MAX_INT_BITS)})")


def _no_huge_counts(name: str, args: Iterable, kwargs: Mapping) -> None:
    """Widths, counts and sizes given as numbers (``center(10**9)``, ``batch(10**9)``, ``'%*d' % (10**9, 1)``)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_SPEC_BYTES:
            raise TemplateLimit("template-too-large", f"{name} is given {count(value)}, more than any spec needs "
                                f"(limit {count(MAX_SPEC_BYTES)})")


def _no_huge_widths(fmt: Any, args: Iterable) -> None:
    """Widths written in a format string (``'%999999999d'``, ``'{:>999999999}'``) or taken from its
    arguments (``'%*d'``, ``'{:{}}'``)."""
    if not isinstance(fmt, str):
        return
    for match in _WIDTH.finditer(fmt):
        for digits in filter(None, match.groups()):
            if len(digits) > len(str(MAX_SPEC_BYTES)) or int(digits) > MAX_SPEC_BYTES:
                raise TemplateLimit("template-too-large", f"the format string {fmt[:40]!r} asks for a width of "
                                    f"{digits[:20]} (limit {count(MAX_SPEC_BYTES)})")
    if _WIDTH_FROM_ARGS.search(fmt):
        _no_huge_counts(f"the format string {fmt[:40]!r}", args, {})


_WIDTH = re.compile(r"%[#0 +\-]*(\d+)?(?:\.(\d+))?|\{[^{}]*:[^{}\d]*(\d+)?[,_]?(?:\.(\d+))?")
_WIDTH_FROM_ARGS = re.compile(r"%[#0 +\-]*\*|\.\*|\{[^{}]*:[^{}]*\{")
