"""Load a spec: read the file, render it (Jinja2, sandboxed) when it is a template, parse YAML safely.

Every value keeps its location: :class:`Source` maps key paths to (line, column) so later stages
can point at the exact place of a problem. Every step is bounded (:mod:`topo.compiler.limits`): the file's
size before it is read, the rendered text, and the nodes and depth of the YAML while it is composed.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import yaml

from topo.compiler.compose import SMALLER, compose
from topo.diagnostics import Diagnostic, error
from topo.errors import SpecError
from topo.compiler.limits import MAX_SPEC_BYTES, count

TEMPLATE_SUFFIXES = (".j2", ".jinja", ".jinja2")
KeyPath = tuple  # a key path: tuple of str | int


@dataclass
class Source:
    """A loaded spec: its data, rendered text, and where each key path sits in the file."""

    file: str
    text: str
    data: Any
    variables: dict[str, str] = field(default_factory=dict)
    locations: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def locate(self, path: KeyPath) -> tuple[int | None, int | None]:
        """Line and column of ``path``, or of its nearest located ancestor."""
        path = tuple(path)
        while True:
            if path in self.locations:
                return self.locations[path]
            if not path:
                return (None, None)
            path = path[:-1]

    def place(self, d: Diagnostic, aliases: Mapping[KeyPath, KeyPath] | None = None) -> Diagnostic:
        """The diagnostic with this source's file, line and column filled in.

        ``aliases`` maps a corrected key path to the misspelt one actually written in the file.
        """
        if d.file is not None:
            return d
        path = tuple(d.path)
        for canonical, written in (aliases or {}).items():
            if path[: len(canonical)] == canonical:
                path = written + path[len(canonical):]
                break
        line, column = self.locate(path)
        return replace(d, file=self.file, line=line, column=column)


def parse_assignments(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["k=v", ...]`` to a dict; values stay strings (YAML types them after rendering)."""
    out: dict[str, str] = {}
    problems = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            problems.append(error("set-syntax", f"--set expects key=value, got {pair!r}", hint="e.g. --set workers=8"))
            continue
        out[key.strip()] = value
    if problems:
        raise SpecError(problems)
    return out


def load(path: str | os.PathLike, variables: Mapping[str, str] | None = None) -> Source:
    """Read, render and parse ``path``. Raises :class:`SpecError` with located diagnostics."""
    file = os.fspath(path)
    variables = dict(variables or {})
    text = _read(file)
    if file.endswith(TEMPLATE_SUFFIXES) or variables:
        text = _render(file, text, variables)
    return parse(text, file, variables)


def parse(text: str, file: str = "<spec>", variables: Mapping[str, str] | None = None) -> Source:
    """Parse YAML text with a safe loader, recording the location of every key path."""
    fail = _failer(file)
    if len(text) > MAX_SPEC_BYTES:  # a string given to the Python API: files and templates stop earlier
        fail("spec-too-large", f"the spec is {count(len(text))} characters (limit {count(MAX_SPEC_BYTES)})", None,
             SMALLER)
    if not text.strip():
        fail("empty-spec", "the spec is empty", None, "start from one of the files in examples/")
    try:
        node = compose(text, file)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        fail("yaml-syntax", f"{exc.problem or exc.context}", mark, "check indentation and quoting near this line")
    except yaml.YAMLError as exc:
        fail("yaml-syntax", str(exc), None, None)
    if node is None:
        fail("empty-spec", "the spec holds no document", None, "start from one of the files in examples/")
    source = Source(file, text, None, dict(variables or {}))
    problems: list[Diagnostic] = []
    source.data = _build(node, (), source, problems)
    if problems:
        raise SpecError([source.place(d) for d in problems])
    return source


def _read(file: str) -> str:
    fail = _failer(file)
    if os.path.isdir(file):
        fail("spec-is-directory", f"{file} is a directory, not a spec file", None, "pass a .yaml file")
    try:
        with open(file, "rb") as handle:
            data = handle.read(MAX_SPEC_BYTES + 1)  # bounded: a FIFO or /dev/zero has no size to check first
            if len(data) > MAX_SPEC_BYTES:
                size = os.fstat(handle.fileno()).st_size
                what = count(size) if size > MAX_SPEC_BYTES else f"more than {count(MAX_SPEC_BYTES)}"
                fail("spec-too-large", f"the spec file is {what} bytes (limit {count(MAX_SPEC_BYTES)})", None, SMALLER)
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it
    except FileNotFoundError:
        fail("spec-not-found", f"no such file: {file}", None, None)
    except UnicodeDecodeError as exc:
        fail("spec-encoding", f"not UTF-8 text ({exc.reason} at byte {exc.start})", None, None)
    except OSError as exc:
        fail("spec-unreadable", f"cannot read {file}: {exc.strerror}", None, None)
    raise AssertionError("unreachable")


def _render(file: str, text: str, variables: Mapping[str, str]) -> str:
    import jinja2

    from topo.compiler.template import TemplateLimit, render

    try:
        return render(text, variables)
    except TemplateLimit as exc:
        _failer(file)(exc.code, str(exc), (_template_line(exc), None), _TEMPLATE_HINTS[exc.code])
    except RecursionError as exc:  # Jinja2 parses and compiles recursively; the error says where it gave up
        _failer(file)("spec-too-deep", "the template nests deeper than Jinja2 can parse (Python's recursion limit)",
                      (_template_line(exc), None), "a spec template needs a few levels of blocks and brackets")
    except jinja2.TemplateSyntaxError as exc:
        where = (exc.lineno, None)
        _failer(file)("template-syntax", exc.message or str(exc), where, None)
    except jinja2.UndefinedError as exc:
        line = _template_line(exc)
        _failer(file)(
            "template-undefined",
            f"template variable is undefined: {exc.message}",
            (line, None),
            "provide it with --set NAME=VALUE",
        )
    except jinja2.TemplateError as exc:
        _failer(file)("template-error", str(exc), (_template_line(exc), None), None)
    except Exception as exc:  # a template can raise anything (e.g. a filter on a wrong type): report, never crash
        _failer(file)("template-error", f"{type(exc).__name__}: {exc}", (_template_line(exc), None), None)
    raise AssertionError("unreachable")


_TEMPLATE_HINTS = {
    "template-too-long": "a spec template needs a few loops over subcollectors or workers; generate larger specs "
                         "with a program",
    "template-too-large": "a spec needs short strings and lists: check the numbers given to *, ** and the filters",
    "spec-too-large": SMALLER,
}


def _template_line(exc: BaseException) -> int | None:
    tb = exc.__traceback__
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _failer(file: str):
    def fail(code: str, message: str, where: Any, hint: str | None):
        if hasattr(where, "line"):  # a yaml.Mark, or libyaml's
            line, column = where.line + 1, where.column + 1
        elif isinstance(where, tuple):
            line, column = where
        else:
            line = column = None
        raise SpecError([Diagnostic(code, "error", message, (), hint, file, line, column)])

    return fail


def _build(node: yaml.Node, path: KeyPath, source: Source, problems: list[Diagnostic],
           inside: frozenset = frozenset()) -> Any:
    source.locations[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if id(node) in inside:  # an alias to a node that contains it (a: &x [*x]) would never end
        problems.append(error("yaml-recursive-alias", "this alias refers to a node that contains it", path,
                              "YAML aliases must not be recursive"))
        return None
    if isinstance(node, yaml.MappingNode):
        inside = inside | {id(node)}
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(error("yaml-complex-key", "mapping keys must be plain scalars", path))
                continue
            if key_node.tag == "tag:yaml.org,2002:merge":
                problems.append(_at(key_node, source, error("yaml-merge-key", "YAML merge keys (<<) are not supported",
                                                             path, "write the keys out, or use a Jinja2 template")))
                continue
            key = _scalar(key_node, path, source, problems)
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                key = str(key)
            child = path + (key,)
            if key in out:
                source.locations[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                problems.append(error("yaml-duplicate-key", f"key {key!r} appears twice in this mapping", child,
                                      "YAML keeps only the last one; remove the duplicate"))
                continue
            out[key] = _build(value_node, child, source, problems, inside)
            source.locations[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
        return out
    if isinstance(node, yaml.SequenceNode):
        inside = inside | {id(node)}
        return [_build(item, path + (i,), source, problems, inside) for i, item in enumerate(node.value)]
    return _scalar(node, path, source, problems)


def _scalar(node: yaml.ScalarNode, path: KeyPath, source: Source, problems: list[Diagnostic]) -> Any:
    try:
        return yaml.constructor.SafeConstructor().construct_object(node, deep=True)
    except Exception as exc:  # noqa: BLE001 - PyYAML's constructors raise anything on odd input (!!timestamp x)
        # an unknown tag (!custom), or a value its type refuses (2024-13-45 is no date)
        message = exc.problem if isinstance(exc, yaml.MarkedYAMLError) and exc.problem else str(exc)
        hint = "quote it to make it a string" if node.tag.startswith("tag:yaml.org,2002:") else \
            f"topo reads plain YAML: remove the tag {node.tag}"
        problems.append(_at(node, source, error("yaml-value", f"cannot read {node.value!r}: {message}", path, hint)))
        return None


def _at(node: yaml.Node, source: Source, d: Diagnostic) -> Diagnostic:
    """``d`` located at ``node`` itself (a key or value without a path of its own)."""
    return replace(d, file=source.file, line=node.start_mark.line + 1, column=node.start_mark.column + 1)
