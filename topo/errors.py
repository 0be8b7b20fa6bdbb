"""One error root. User errors exit 2 and carry diagnostics; launch failures exit 1."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from topo.diagnostics import Diagnostic


class TopoError(Exception):
    """Root of every error topo raises on purpose."""

    exit_code = 1

    def format(self) -> str:
        return f"error: {self}"


class SpecError(TopoError):
    """The spec (or a saved plan) cannot be used: every diagnostic found, errors and warnings."""

    exit_code = 2

    def __init__(self, diagnostics: Sequence[Diagnostic]):
        self.diagnostics = list(diagnostics)
        errors = [d for d in self.diagnostics if d.is_error]
        super().__init__(f"{len(errors)} error(s) in spec")

    def format(self) -> str:
        return "\n".join(d.format() for d in self.diagnostics)


class UsageError(TopoError):
    """Options that do not go together (no spec location to point at)."""

    exit_code = 2


class RecordError(UsageError):
    """A file from a run directory, a checkpoint or an actions file that topo does not read: which file (and
    line), what it holds, what to do. Such files are data: one topo cannot read is refused, never run."""

    def __init__(self, file: str, message: str, *, line: int | None = None, hint: str | None = None):
        self.file, self.line, self.hint = str(file), line, hint
        super().__init__(f"{self.file}{'' if line is None else f':{line}'}: {message}")

    def format(self) -> str:
        return f"error: {self}" + (f"\n  hint: {self.hint}" if self.hint else "")


class StalePlanError(TopoError):
    """A saved plan no longer matches its spec, or was written by an incompatible topo."""

    exit_code = 2


class LaunchError(TopoError):
    """A launch failed; names the subcollector, the worker and its plan row when one is to blame."""

    exit_code = 1

    def __init__(
        self,
        message: str,
        *,
        subcollector: int | None = None,
        worker: int | None = None,
        row: Mapping[str, Any] | None = None,
        traceback: str | None = None,
    ):
        super().__init__(message)
        self.subcollector = subcollector
        self.worker = worker
        self.row = dict(row) if row is not None else None
        self.traceback = traceback

    def format(self) -> str:
        lines = [f"error: {self}"]
        if self.subcollector is not None:
            kind = "eval " if (self.row or {}).get("role") == "eval" else ""  # a row of the plan's eval section
            where = f"{kind}subcollector {self.subcollector}"
            if self.worker is not None:
                where += f", {kind}worker {self.worker}"
            lines.append(f"  at {where}")
        if self.row:
            keys = ("global_index", "task_id", "seed", "group_id_offset", "init_state_id", "render_gpu", "instruction",
                    "tasks", "episodes")
            lines.append("  plan row: " + ", ".join(f"{k}={self.row[k]!r}" for k in keys if k in self.row))
        if self.traceback:
            lines.append("  worker traceback:")
            lines.extend("    " + line for line in self.traceback.rstrip().splitlines())
        return "\n".join(lines)


class Interrupted(TopoError):
    """Ctrl-C (130) or SIGTERM (143) arrived; everything was torn down."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by {signal.Signals(signum).name}; all processes torn down")
