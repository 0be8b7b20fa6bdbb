"""A run of a plan in the caller's process: the collector a training loop iterates, with topo's guarantees.

    with topo.collector("spec.yaml", policy_factory=make_policy, policy=policy) as run:
        for batch in run.collector:          # the real torchrl collector
            ...
            run.update_weights()             # every subcollector (or the server) acts with them next
    print(run.report)

``topo launch`` is this, with a loop that collects N batches. Around the torchrl collector a run keeps:

- no env outside env workers: one factory + per-worker kwargs + worker metadata; the trainer's policy
  is given to torchrl so that no weight-sync scheme calls a factory here; an env factory called in the
  trainer refuses to build;
- the startup deadline and the first failure named (worker, plan row, traceback, how it died), by a
  monitor thread (:mod:`.monitor`); a hung env step found (``launch.hang_timeout``); a subcollector that
  failed while collecting started again with its plan rows, the others going on (``launch.restarts``,
  :mod:`.respawn`);
- teardown of everything the run started, by environment (:mod:`.processes`), when the block ends,
  raises, on Ctrl-C and SIGTERM, and by a torch-free watcher process when the trainer is killed;
- the trainer's state as it was: start method, torch threads, signal handlers, environment.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from .. import gl
from ..errors import Interrupted, TopoError, UsageError
from ..plan import engine
from ..rundir import RESTART_VAR, RUN_DIR_VAR, SLOTS_VAR, RunDir
from . import failure as failures, observe, plans, processes, watcher
from .monitor import Monitor
from .policy import Placement, PolicySetup
from .progress import Progress
from .recovery import Recovery
from .state import Phase, RunState

SETTLE_S = 2.0  # after torchrl raises: time for the monitor to see the death or record behind it
LEFTOVER_GRACE_S = 5.0  # after the collector shut down, for processes to exit on their own (a forkserver that preloaded torch takes ~2 s)
TERM_GRACE_S = 3.0  # then SIGTERM, this long, then SIGKILL
WATCHER_EXIT_S = 5.0
#: collector arguments that the plan or the policy placement decides
RESERVED_KWARGS = ("create_env_fn", "create_env_kwargs", "num_workers", "frames_per_batch", "total_frames", "sync",
                   "policy", "policy_factory", "weight_sync_schemes", "weight_updater")
TRAINER_VAR = "TOPO_TRAINER_PID"  # set while the run starts processes: an env factory refuses to run there


class _Aborted(BaseException):
    """The monitor found a failure while the trainer waited inside topo (a signal brought it here)."""


class _Signalled(BaseException):
    """SIGTERM or SIGHUP: a BaseException, so that no ``except Exception`` in a training loop swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def engine_for(plan: dict[str, Any]):
    """The engine that runs the plan's subcollectors: ``local`` processes or ``ray`` actors."""
    if engine(plan) == "ray":
        from .ray_collector import RayEngine

        return RayEngine()
    from .local import LocalEngine

    return LocalEngine()


class Run:
    """One run of a plan: start it with ``with`` (or :meth:`start`), iterate :attr:`collector`.

    Attributes: ``plan``; ``collector`` (the torchrl collector, once started); ``report`` (a
    :class:`~topo.launch.report.Report`, once ended); ``run_dir``; ``policy_version`` (weight updates
    pushed so far); ``restarts`` (subcollector restarts so far); ``failure`` (what failed, if anything).
    """

    _active: Run | None = None  # the run started in this process and not yet ended

    def __init__(self, plan: dict[str, Any], *, policy_factory: str | Callable | None = None, policy=None,
                 report_dir: str | None = None, progress: bool = True, progress_while_collecting: bool = False,
                 startup_timeout: float | None = None, max_concurrent_starts: int | None = None,
                 process_logs: bool = False, command: dict | None = None, **collector_kwargs: Any):
        clash = sorted(set(collector_kwargs) & set(RESERVED_KWARGS))
        if clash:
            raise UsageError(f"topo sets {', '.join(clash)} from the plan and the policy placement: change the spec "
                            "(collector, policy sections) or pass policy=/policy_factory= instead")
        _check_replay_buffer(collector_kwargs.get("replay_buffer"))
        self.plan = plan
        self.engine = engine_for(plan)
        self.setup = PolicySetup.resolve(plan.get("policy"), policy_factory)
        self.placement = Placement(self.setup, policy, len(plan["subcollectors"]),
                                   collector_acks=self.engine.name == "local") if self.setup else None
        if policy is not None and self.placement is None:
            raise UsageError("policy= needs a policy factory to build the copies that act: pass policy_factory= or "
                            "give the spec a policy section")
        self.engine = engine_for(plan)
        if policy is not None and self.engine.name != "local":
            raise UsageError("weight updates reach local subcollectors only: with placement.engine ray, each actor "
                             "builds its copy from the policy factory and keeps its weights (drop policy=)")
        self.report_dir = report_dir
        self.process_logs = process_logs
        # with process logs, the processes started get this process's stdout/stderr as a file: progress keeps the terminal
        stream = os.fdopen(os.dup(2), "w", buffering=1) if process_logs and progress else sys.stderr
        self.progress = Progress(progress, stream=stream, collecting=progress_while_collecting)
        self.startup_timeout = float(startup_timeout or plan["launch"]["startup_timeout"])
        self.max_concurrent_starts = max_concurrent_starts or plan["launch"].get("max_concurrent_starts")
        self.shutdown_budget = plans.shutdown_budget(plan)
        self.command = command or {"argv": list(sys.argv), "cwd": os.getcwd()}
        self.collector_kwargs = collector_kwargs
        self.collector = None
        self.report = None
        self.error: BaseException | None = None  # what ended the run, as the report states it
        self.state: RunState | None = None
        self.monitor: Monitor | None = None
        self.recovery: Recovery | None = None
        self.ready_at = self.teardown_started = self.finished = None
        self.shutdown_at = self.shutdown_done = None
        self.exit_codes: list | None = None
        self.left_behind: list[int] = []
        self.killed: list[int] = []
        self.alive_after: list[int] = []
        self.watcher_exit: int | None = None
        self.extra: dict[str, Any] = {}  # what the caller adds to the report's launch section (the CLI: batches)
        self._watcher = None
        self._saved: _TrainerState | None = None
        self._section = threading.Lock()
        self._in_section = False
        self._main = threading.main_thread().ident

    # -- the public surface ---------------------------------------------------------------------
    @property
    def run_dir(self) -> str | None:
        return self.state.run.path if self.state else None

    @property
    def failure(self) -> failures.Failure | None:
        return self.monitor.failure if self.monitor else None

    @property
    def policy_version(self) -> int:
        return self.placement.version if self.placement else 0

    @property
    def restarts(self) -> list[dict]:
        """Each subcollector restart so far (``launch.restarts``): who failed and how, when, the seconds to
        its first batch again, the new pids and seeds; the report's ``restarts`` section."""
        from .report import restarts

        if self.state is None:
            return []
        with self.monitor.lock:
            return restarts(self.state)

    def update_weights(self, policy_or_weights=None) -> int:
        """Push the trainer's policy weights (or ``policy_or_weights``) to every acting copy; the new version.

        Synchronous: when it returns, every subcollector (or the server) acts with the new weights, and
        the rows it collects from then on carry ``policy_version`` equal to the returned value.
        """
        if self.placement is None:
            raise UsageError("this run has no policy to update: give it a policy factory (spec policy section, "
                            "or policy_factory=)")
        if self.state is None or self.state.phase is not Phase.COLLECTING:
            raise UsageError("weights can be updated only while the run collects (inside its with block)")
        try:
            with self._interruptible():
                return self.placement.update(self.collector, policy_or_weights)
        except _Aborted:
            raise self.failure.error() from None

    def __enter__(self) -> Run:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        raised = self.close(exc)
        if raised is not None and raised is not exc:
            raise raised from exc
        return False

    # -- starting -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every process of the plan and build the collector; raises what went wrong, after teardown."""
        if Run._active is not None:
            raise UsageError("a topo run is already active in this process: one at a time")
        if os.environ.get(TRAINER_VAR):
            raise UsageError("topo.collector was called in a process that a run started (a subcollector or the policy "
                             "server): spawned processes import the training script again, so keep its loop under "
                             "`if __name__ == '__main__':`")
        self.engine.check(self.plan)
        if self.placement is not None:
            self.placement.check()
        if self.report_dir:
            os.makedirs(self.report_dir, exist_ok=True)
        run = RunDir(tempfile.mkdtemp(prefix="topo-run-", dir=os.path.abspath(self.report_dir) if self.report_dir else None))
        self.state = RunState(self.plan, run, time.time())
        with open(os.path.join(run.path, "launch.json"), "w") as f:
            json.dump({"plan": self.plan, "policy": self.setup.describe() if self.setup else None,
                       "shutdown_timeout": self.shutdown_budget}, f)
        Run._active = self
        self._saved = _TrainerState.save()
        self._watcher = watcher.start(run.path, temporary=self.report_dir is None)
        self.monitor = Monitor(self.state, self.startup_timeout, self.progress, self._on_failure)
        self._saved.catch(_raise_signalled)
        self.monitor.start()
        try:
            with self._launch_environment(), self._interruptible():
                multiprocessing.set_start_method(self.plan["start_methods"]["subcollectors"], force=True)
                kwargs = dict(self.collector_kwargs)
                kwargs.update(observe.hooks_with(kwargs.get("pre_collect_hook"), kwargs.get("post_collect_hook")))
                if self.placement is not None:
                    self.placement.start_server(self.startup_timeout - self.state.elapsed(time.time()))
                    kwargs.update(self.placement.collector_kwargs(run))
                self.collector = self.engine.build(self.plan, **kwargs)
                self.recovery = Recovery(self)
                self.engine.supervise(self.collector, self.recovery)
        except BaseException as exc:  # noqa: BLE001 - every way out tears down first
            raised = self._end(exc)
            if raised is exc:
                raise
            raise raised from exc
        self.ready_at = time.time()
        self.state.phase = Phase.COLLECTING

    @contextlib.contextmanager
    def _launch_environment(self, restart: int = 0):
        """What the processes started now inherit: the run directory, start slots, the restart number of a
        subcollector started again, GL held off (:mod:`topo.gl`)."""
        values = {RUN_DIR_VAR: self.state.run.path, TRAINER_VAR: str(os.getpid())}
        if self.max_concurrent_starts:
            values[SLOTS_VAR] = str(self.max_concurrent_starts)
        if restart:
            values[RESTART_VAR] = str(restart)
        held = gl.HELD_VAR not in os.environ
        gl.hold()
        logs = self._log_to(os.path.join(self.state.run.path, "processes.log")) if self.process_logs else None
        try:
            with _environ(values):
                yield
        finally:
            if logs is not None:
                logs()
            if held:
                gl.release()

    def restart_environment(self, restart: int):
        """The launch window, for the processes of a subcollector's ``restart``-th start."""
        return self._launch_environment(restart)

    @staticmethod
    def _log_to(path: str) -> Callable[[], None]:
        """This process's stdout and stderr into ``path`` (processes started now inherit them); returns the undo."""
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)

        def undo() -> None:
            sys.stdout.flush()
            sys.stderr.flush()
            for target, original in zip((1, 2), saved):
                os.dup2(original, target)
                os.close(original)

        return undo

    @contextlib.contextmanager
    def _interruptible(self):
        """While the trainer waits in topo, a failure the monitor finds interrupts the wait (SIGINT, main thread)."""
        if threading.get_ident() != self._main:
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def on_sigint(signum, frame):
            if self.monitor is not None and self.monitor.failure is not None:
                raise _Aborted()
            if callable(previous):
                previous(signum, frame)
            else:
                raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)
        with self._section:
            self._in_section = True
        try:
            if self.monitor is not None and self.monitor.failure is not None:
                raise _Aborted()  # found while the trainer was elsewhere: do not start a wait it would end
            yield
        finally:
            with self._section:
                self._in_section = False
            signal.signal(signal.SIGINT, previous)

    def _on_failure(self, found: failures.Failure) -> None:
        """In the monitor thread: stop what cannot go on, and bring the trainer out of topo's waits."""
        if self.state.phase is Phase.STARTING:
            # nothing to close yet: ending the processes makes torchrl's constructor return at once
            threading.Thread(target=self._end_processes, name="topo-abort", daemon=True).start()
        with self._section:
            if self._in_section:
                signal.pthread_kill(self._main, signal.SIGINT)

    def _end_processes(self) -> None:
        self.killed.extend(processes.terminate(self._processes(), TERM_GRACE_S))

    def _processes(self) -> list:
        return processes.of_run(self.state.run.path, os.getpid())

    # -- ending ---------------------------------------------------------------------------------
    def close(self, exc: BaseException | None = None) -> BaseException | None:
        """Tear the run down. ``exc`` is what ended it, if anything; returns what the caller should raise
        (``exc`` itself, topo's error naming the failure, or None)."""
        if self.state is None or self.state.phase is Phase.DONE:
            return exc
        return self._end(exc)

    def _end(self, exc: BaseException | None) -> BaseException | None:
        self._saved.catch(_ignore_signal)  # teardown runs to its end; it is bounded
        self.error, raised = self._classify(exc)
        try:
            self._teardown()
        finally:
            self._saved.restore()
            Run._active = None
        return raised

    def _classify(self, exc: BaseException | None) -> tuple[BaseException | None, BaseException | None]:
        """(what the report states, what the caller raises: ``exc`` itself or topo's error for it)."""
        if exc is None:
            return None, None
        if isinstance(exc, _Aborted):
            err = self.failure.error()
            return err, err
        if isinstance(exc, _Signalled):
            err = Interrupted(exc.signum)
            return err, err
        if isinstance(exc, KeyboardInterrupt):
            return Interrupted(signal.SIGINT), exc
        if _from_collector(exc) and not isinstance(exc, TopoError):
            err = (self._settle() or failures.collector_error(exc)).error()
            return err, err
        return exc, exc  # topo's own error, or the training loop's: teardown, report, then it propagates

    def _settle(self) -> failures.Failure | None:
        """The failure behind a torchrl error: what the monitor found, or finds within ``SETTLE_S``."""
        deadline = time.monotonic() + SETTLE_S
        while self.monitor.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.monitor.failure

    def _teardown(self) -> None:
        state = self.state
        self.teardown_started = time.time()
        state.phase = Phase.SHUTTING_DOWN
        try:
            if self.collector is not None:
                self.shutdown_at = time.time()
                self.exit_codes = self.engine.shutdown(self.collector, self.shutdown_budget)
                self.shutdown_done = time.time()
                self.recovery.close()
            else:
                self._end_processes()
            if self.placement is not None:
                self.placement.shutdown(TERM_GRACE_S)
        finally:
            self.monitor.stop()
            # a forkserver the trainer started for forkserver subcollectors serves the trainer until it exits
            processes.terminate([p for p in self._processes() if p.ppid() == os.getpid() and processes.is_forkserver(p)],
                                TERM_GRACE_S)
            left = processes.wait(self._processes(), LEFTOVER_GRACE_S)
            self.left_behind = sorted(p.pid for p in left)
            self.killed += processes.terminate(left, TERM_GRACE_S)
            self.alive_after = sorted(p.pid for p in self._processes())
            self._stop_watcher()
            state.phase = Phase.DONE
            self.finished = time.time()
            self.progress.finish()
            self._write_report()

    def _stop_watcher(self) -> None:
        try:
            self._watcher.stdin.write(b"done\n")
            self._watcher.stdin.close()
        except OSError:
            pass
        try:
            self.watcher_exit = self._watcher.wait(WATCHER_EXIT_S)
        except Exception:  # noqa: BLE001 - a watcher that does not exit is ended here
            self._watcher.kill()
            self.watcher_exit = self._watcher.wait()

    def _write_report(self) -> None:
        from .report import Report

        self.report = Report.of(self)
        run = self.state.run.path
        if self.report_dir:
            self.report.write(self.report_dir)
        elif self.error is None or not isinstance(self.error, TopoError) or isinstance(self.error, Interrupted):
            shutil.rmtree(run, ignore_errors=True)
        else:
            self.report.write(run)
            print(f"topo: run directory kept: {run}", file=sys.stderr)


def collector(source, *, variables: dict[str, str] | None = None, spec: str | None = None, allow_edited: bool = False,
              **options: Any) -> Run:
    """A :class:`Run` of ``source``: a spec path, a saved plan's path, or a plan dict (each checked).

    ``variables`` render a Jinja2 spec; ``spec`` is the spec a saved plan came from (the plan is refused
    if it changed); ``allow_edited`` runs a plan whose digest no longer matches. Every other keyword goes
    to :class:`Run` (``policy_factory``, ``policy``, ``report_dir``, ``startup_timeout``, ...) or, if
    :class:`Run` does not take it, to the torchrl collector (``replay_buffer``, ``env_device``, ...).
    """
    return Run(plans.resolve(source, variables, spec, allow_edited=allow_edited), **options)


def _check_replay_buffer(rb) -> None:
    """torchrl initialises an empty, unshared storage by building subcollector 0's env in the caller."""
    storage = getattr(rb, "_storage", None)
    if storage is None or getattr(storage, "initialized", True) or getattr(storage, "shared_init", False):
        return
    raise UsageError("this replay buffer's storage is not initialised: torchrl would build subcollector 0's envs in "
                    "the trainer to shape it; use LazyTensorStorage(..., shared_init=True) with "
                    "TensorDictReplayBuffer(..., shared=True), or initialise the storage before the run")


def _from_collector(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside torchrl or tensordict (not by the training loop's own code)."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith(("torchrl.", "tensordict.")):
            return True
        tb = tb.tb_next
    return False


def _raise_signalled(signum, frame):
    raise _Signalled(signum)


def _ignore_signal(signum, frame):
    pass


class _TrainerState:
    """What a run changes in the trainer process, saved at start and put back at the end."""

    SIGNALS = (signal.SIGTERM, signal.SIGHUP)

    def __init__(self, start_method: str | None, threads: int | None, handlers: dict):
        self.start_method = start_method
        self.threads = threads
        self.handlers = handlers

    @classmethod
    def save(cls) -> _TrainerState:
        threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        main = threading.current_thread() is threading.main_thread()
        handlers = {s: signal.getsignal(s) for s in (*cls.SIGNALS, signal.SIGINT)} if main else {}
        return cls(multiprocessing.get_start_method(allow_none=True), threads, handlers)

    def catch(self, handler) -> None:
        """Route SIGTERM and SIGHUP to ``handler`` where the trainer left them at their default."""
        for s in self.SIGNALS:
            if s in self.handlers and self.handlers[s] in (signal.SIG_DFL, None):
                signal.signal(s, handler)
        if handler is _ignore_signal and signal.SIGINT in self.handlers:
            signal.signal(signal.SIGINT, handler)

    def restore(self) -> None:
        multiprocessing.set_start_method(self.start_method, force=True)
        if self.threads is not None:
            sys.modules["torch"].set_num_threads(self.threads)
        for s, handler in self.handlers.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """``os.environ`` with ``values`` set, each variable put back as it was afterwards."""
    saved = {var: os.environ.get(var) for var in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
