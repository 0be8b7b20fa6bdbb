"""What every rule shares: the backend a spec names, and its task catalog."""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from topo.backends import Backend, PluginError, TaskCatalog, get_backend, names
from topo.diagnostics import Diagnostic, error
from topo.compiler.rules.suites import qualified
from topo.compiler.spec import Spec


@dataclass(frozen=True)
class Context:
    backend: Backend | None  # None: the backend is unknown or cannot be loaded
    catalog: TaskCatalog | None  # None: the backend has none, or its own checks failed


def context(spec: Spec) -> tuple[Context, list[Diagnostic]]:
    """The backend and its catalog (several suites' union in a multi-suite spec), with what the backend says of
    env.kwargs, env.options, blocks' kwargs and the suites task items name."""
    backend, out = load_backend(spec.backend)
    catalog = None
    if backend is not None:
        out += backend.check_kwargs(spec.env_kwargs, ("env", "kwargs"))
        out += backend.check_options(spec.env_options, ("env", "options"))
        for i, block in enumerate(spec.blocks or ()):
            # a block's kwargs go through the same checks; keep what is about its own keys
            where = ("assignment", "blocks", i, "kwargs")
            out += [d for d in backend.check_kwargs({**spec.env_kwargs, **block.kwargs}, where)
                    if d.path[:len(where)] == where and len(d.path) > len(where) and d.path[len(where)] in block.kwargs]
    suites = qualified(spec, backend)
    out += suites
    # the catalog is read from the suites alone: a misspelt camera kwarg leaves the task ids checked
    if backend is not None and not any(d.is_error and (d in suites or _names_suite(d, backend)) for d in out):
        catalog = backend.suites_catalog(spec.env_kwargs, spec.suites) if spec.suites else backend.catalog(spec.env_kwargs)
    return Context(backend, catalog), out


def _names_suite(d: Diagnostic, backend: Backend) -> bool:
    """Whether ``d`` is about a kwarg that chooses the task suite (where the env's or a block's kwargs set it)."""
    return bool(backend.suite_key) and bool(d.path) and d.path[-1] == backend.suite_key


def load_backend(name: str) -> tuple[Backend | None, list[Diagnostic]]:
    """The backend called ``name``, or None and why not."""
    try:
        return get_backend(name), []
    except PluginError as exc:
        return None, [error("backend-plugin-broken", f"plug-in backend {name!r}: {exc}", ("env", "backend"),
                            "fix or reinstall the package that provides it (`topo --help` lists the backends found)")]
    except KeyError:
        known = names()
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}?" if close else (
            f"use one of {', '.join(known)}, a plug-in's name, or a factory 'package.module:callable'")
        return None, [error("backend-unknown", f"unknown backend {name!r}", ("env", "backend"), hint)]
    except ImportError as exc:
        return None, [error("backend-unavailable", f"backend {name!r} cannot be loaded: {exc}", ("env", "backend"),
                            "install its extra, e.g. pip install -e '.[libero]'")]
