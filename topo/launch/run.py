"""A run of a plan in the caller's process: the collector a training loop iterates, with topo's guarantees.

    with topo.collector("spec.yaml", policy_factory=make_policy, policy=policy) as run:
        for batch in run.collector:          # the real torchrl collector
            ...
            run.update_weights()             # every subcollector (or the server) acts with them next
    print(run.report)

``topo launch`` is this, with a loop that collects N batches. :class:`Run` is a facade; each guarantee
lives in its own module: no env outside env workers (:mod:`.local`, :mod:`.policy`); the torchrl it runs
on, checked first (:mod:`.boundary`); the first failure named (:mod:`.monitor` decides, :mod:`.delivery`
brings it to the trainer); restarts with the plan's rows (:mod:`.restarts`, :mod:`.recovery`,
:mod:`.respawn`); teardown within one deadline (:mod:`.teardown`, and :mod:`.watcher` if the trainer is
killed); the trainer's process state put back (:mod:`.trainer`); the report (:mod:`.report`); the plan's
evaluation in an eval process of its own (:mod:`.eval_service`).
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from typing import Any, Callable

from topo.errors import LaunchError, UsageError
from topo.runtime.rundir import RunDir
from topo.launch import boundary, observe, trainer
from topo.launch.supervision import failure as failures, teardown, watcher
from topo.compiler import saved as plans
from topo.launch.supervision.delivery import Delivery
from topo.launch.engines import engine_for
from topo.launch.evaluation.service import EvalService
from topo.launch.supervision.monitor import Monitor
from topo.launch.policy import Placement, PolicySetup
from topo.launch.supervision.progress import Progress
from topo.launch.supervision.recovery import Recovery
from topo.launch.report import Outcome, Report
from topo.launch.supervision.state import Phase, RunState

#: collector arguments that the plan or the policy placement decides
RESERVED_KWARGS = ("create_env_fn", "create_env_kwargs", "num_workers", "frames_per_batch", "total_frames", "sync",
                   "policy", "policy_factory", "weight_sync_schemes", "weight_updater")


class Run:
    """One run of a plan: start it with ``with`` (or :meth:`start`), iterate :attr:`collector`.

    Attributes: ``plan``; ``collector`` (the torchrl collector, once started); ``report`` (a
    :class:`~topo.launch.report.Report`, once ended); ``run_dir``; ``policy_version`` (weight updates
    pushed so far); ``restarts`` (subcollector restarts so far); ``recycles`` (subcollectors rebuilt past a health
    budget so far); ``failure`` (what failed, if anything);
    ``evaluations`` (each evaluation's result so far: :meth:`evaluate`, ``eval.every``).
    ``evaluation=False`` starts no eval process even when the plan has an eval section.
    """

    _active: Run | None = None  # the run started in this process and not yet ended

    def __init__(self, plan: dict[str, Any], *, policy_factory: str | Callable | None = None, policy=None,
                 report_dir: str | None = None, progress: bool = True, progress_while_collecting: bool = False,
                 startup_timeout: float | None = None, max_concurrent_starts: int | None = None,
                 process_logs: bool = False, command: dict | None = None, evaluation: bool = True,
                 **collector_kwargs: Any):
        self.plan = plan
        self.setup, self.features, self.torchrl, self.engine, self.placement = _parts(plan, policy_factory, policy,
                                                                                    collector_kwargs)
        self.report_dir, self.process_logs, self.collector_kwargs = report_dir, process_logs, collector_kwargs
        self.evaluation = evaluation  # False: no eval process even when the plan has an eval section
        # with process logs, the processes started get this process's stdout/stderr as a file: progress keeps the terminal
        stream = os.fdopen(os.dup(2), "w", buffering=1) if process_logs and progress else sys.stderr
        self.progress = Progress(progress, stream=stream, collecting=progress_while_collecting)
        self.startup_timeout = float(startup_timeout or plan["launch"]["startup_timeout"])
        self.max_concurrent_starts = max_concurrent_starts or plan["launch"].get("max_concurrent_starts")
        self.shutdown_budget = teardown.shutdown_budget(plan)
        self.command = command or {"argv": list(sys.argv), "cwd": os.getcwd()}
        self.extra: dict[str, Any] = {}  # what the caller adds to the report's launch section (the CLI: batches)
        self.collector = self.report = self.state = self.monitor = self.recovery = self.ready_at = None
        self.error: BaseException | None = None  # what ended the run, as the report states it
        self.delivery = Delivery()
        self.down = teardown.Record()
        self.eval: EvalService | None = None  # the eval process, when the plan has an eval section

    @property
    def run_dir(self) -> str | None:
        return self.state.run.path if self.state else None

    @property
    def failure(self) -> failures.Failure | None:
        return self.delivery.failure

    @property
    def policy_version(self) -> int:
        return self.placement.version if self.placement else 0

    @property
    def restarts(self) -> list[dict]:
        """Each subcollector restart so far (``launch.restarts``): who failed and how, when, the seconds to
        its first batch again, the new pids and seeds; the report's ``restarts`` section."""
        from topo.launch.report import restarts

        if self.state is None:
            return []
        with self.monitor.lock:
            return restarts(self.state)

    @property
    def recycles(self) -> list[dict]:
        """Each subcollector recycle so far (``launch.recycle``: a worker past a health budget): the worker, the
        budget, its value and plan row, when, the seconds to rebuild it, the new pids and seeds; the report's
        ``recycles`` section. Recycles spend no restart budget."""
        from topo.launch.report import recycles

        if self.state is None:
            return []
        with self.monitor.lock:
            return recycles(self.state)

    def worker_memory(self) -> list[dict]:
        """Each env worker's latest resident memory, with its plan row: ``subcollector``, ``worker``,
        ``global_index``, ``restart``, ``pid``, ``rss_mb``, ``peak_rss_mb`` (its high-water mark) and ``at``
        (``time.time()`` of the reading; figures None until read). Workers read their own memory after
        construction, while stepping (at most every second) and at close (:mod:`topo.runtime.heartbeat`); this reads
        their heartbeat files, cheap enough to call between batches."""
        if self.state is None:
            return []
        with self.monitor.lock:
            return self.state.memory()

    def episodes(self):
        """The episodes recorded so far (:class:`topo.runtime.episodes.Episodes`): every ``topo_episode`` id in the
        batches resolves there to its plan row, worker life, seed state and the policy versions that acted
        (those of the batches already out of each subcollector). Reads the run directory: call it between batches."""
        from topo.runtime.episodes import Episodes

        if self.state is None:
            raise UsageError("the run has not started: its episodes are recorded once it has")
        return Episodes(self.state.run.path)

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
        with self.delivery.interruptible():
            version = self.placement.update(self.collector, policy_or_weights)
        every = (self.plan.get("eval") or {}).get("every")
        if every and version % every == 0:
            self.evaluate(wait=not self.plan["eval"].get("async"), step=version)
        return version

    def evaluate(self, *, wait: bool = True, step: int | None = None) -> dict[str, Any] | bool | None:
        """Evaluate the trainer's current weights on the plan's eval rows (every planned episode once).

        ``wait``: block and return the result (:mod:`topo.launch.evaluation.results`); else start it in the
        background and return whether it was accepted (``eval.busy_policy``); results gather in
        :attr:`evaluations`. ``step`` is the trainer's, recorded with the result.
        """
        if self.eval is None:
            raise UsageError("this plan has no eval section: add one to the spec (docs/guides/evaluation.md)")
        if self.state is None or self.state.phase is not Phase.COLLECTING:
            raise UsageError("evaluation runs only while the run collects (inside its with block)")
        weights = self.placement.current_weights() if self.placement else None
        with self.delivery.interruptible():
            accepted = self.eval.trigger(weights, version=self.policy_version, step=step)
            return self.eval.wait() if wait else accepted

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """The results of the evaluations that ended so far, oldest first."""
        if self.eval is None:
            return []
        if self.state is not None and self.state.phase is Phase.COLLECTING:
            self.eval.pending  # reads the results that arrived  # noqa: B018
        return list(self.eval.results)

    def __enter__(self) -> Run:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        raised = self.close(exc)
        if raised is not None and raised is not exc:
            raise raised from exc
        return False

    def start(self) -> None:
        """Start every process of the plan and build the collector; raises what went wrong, after teardown."""
        _refuse_nested(Run._active is not None)
        for warning in self.torchrl.warnings(self.features):
            print(f"warning: {warning}", file=sys.stderr)
        self.engine.check(self.plan)
        if self.placement is not None:
            self.placement.check()
        path = _run_directory(self.report_dir, {
            "plan": self.plan, "policy": self.setup.describe() if self.setup else None,
            "shutdown_timeout": self.shutdown_budget, "torchrl": self.torchrl.to_dict(self.features)})
        self.state = RunState(self.plan, RunDir(path), time.time())
        Run._active = self
        self._saved = trainer.TrainerState.save()
        self._watcher = watcher.start(path, temporary=self.report_dir is None)
        self.monitor = Monitor(self.state, self.startup_timeout, self.progress, self._on_failure)
        self._saved.catch(trainer.raise_signalled)
        self.monitor.start()
        try:
            with self._window(), self.delivery.interruptible():
                multiprocessing.set_start_method(self.plan["start_methods"]["subcollectors"], force=True)
                kwargs = dict(self.collector_kwargs)
                kwargs.update(observe.hooks_with(kwargs.get("pre_collect_hook"), kwargs.get("post_collect_hook")))
                self.engine.connect(self.plan)
                if self.placement is not None:
                    self.placement.start_server(self.startup_timeout - self.state.elapsed(time.time()), self.state.run,
                                                actor=self.plan["placement"].get("server"), on_death=self.monitor.submit)
                    kwargs.update(self.placement.collector_kwargs(self.state.run))
                self.collector = self.engine.build(self.plan, **kwargs)
                if "restarts" in self.engine.capabilities:
                    self.recovery = Recovery(
                        self.state, self.monitor, self.delivery, window=self._window,
                        restart_policy=self.placement.restart_factory if self.placement else lambda index: None,
                        weights=lambda: self.placement.sender if self.placement else None)
                    self.engine.supervise(self.collector, self.recovery)
        except BaseException as exc:  # noqa: BLE001 - every way out tears down first
            raised = self._end(exc)
            if raised is exc:
                raise
            raise raised from exc
        if self.plan.get("eval") and self.evaluation:
            self.eval = EvalService(self.plan, self.state.run.path, policy_factory=self.setup.factory if self.setup else None,
                                    startup_timeout=self.startup_timeout, process_logs=self.process_logs)
            self.eval.start()  # it builds its eval collector while this one collects
        self.ready_at = time.time()
        self.state.phase = Phase.COLLECTING

    def _window(self, restart: int = 0):
        return trainer.launch_window(self.state.run.path, max_concurrent_starts=self.max_concurrent_starts,
                                     process_logs=self.process_logs, restart=restart,
                                     record=plans.recording(self.plan))

    def _on_failure(self, found: failures.Failure) -> None:
        """In the monitor's thread: stop what cannot go on, then deliver the failure to the trainer."""
        if self.state.phase is Phase.STARTING:
            # nothing to close yet: ending the processes makes torchrl's constructor return at once
            abort = functools.partial(teardown.abort, self.state.run.path, os.getpid())
            threading.Thread(target=lambda: self.down.killed.extend(abort()), name="topo-abort", daemon=True).start()
        self.delivery.deliver(found)

    def close(self, exc: BaseException | None = None) -> BaseException | None:
        """Tear the run down. ``exc`` is what ended it, if anything; returns what the caller should raise
        (``exc`` itself, topo's error naming the failure, or None)."""
        if self.state is None or self.state.phase is Phase.DONE:
            return exc
        return self._end(exc)

    def _end(self, exc: BaseException | None) -> BaseException | None:
        self._saved.catch(trainer.ignore_signal)  # teardown runs to its end; it is bounded
        self.error, raised = self.delivery.classify(exc)
        self.state.phase = Phase.SHUTTING_DOWN
        try:
            teardown.run(self.down, teardown.Deadline(self.shutdown_budget), run_path=self.state.run.path,
                         trainer=os.getpid(), graceful=self._graceful, stop_monitor=self.monitor.stop,
                         watcher=self._watcher)
        finally:
            self.state.phase = Phase.DONE
            self.progress.finish()
            self._write_report()
            self._saved.restore()
            Run._active = None
        return raised

    def _graceful(self, deadline: teardown.Deadline) -> None:
        """The eval process closes its run; the engine closes envs and subcollectors (or, never built, they are
        ended); then the policy server; then the engine leaves its cluster."""
        if self.eval is not None:
            self.eval.close(deadline.left() - teardown.shutdown_budget(self.plan, evaluation=False))
        if self.collector is not None:
            self.down.shutdown_at = time.time()
            self.down.exit_codes = self.engine.shutdown(self.collector, deadline.left())
            self.down.shutdown_done = time.time()
            if self.recovery is not None:
                self.recovery.close()
        else:
            self.down.killed += teardown.abort(self.state.run.path, os.getpid())
        try:
            if self.placement is not None:
                self.placement.shutdown(deadline.left("server"))
        finally:
            self.engine.disconnect()

    def _write_report(self) -> None:
        self.report = Report.of(Outcome(
            self.state, self.error, self.command, self.engine.name, self.startup_timeout, self.shutdown_budget,
            self.max_concurrent_starts, self.ready_at, self.down, self.monitor.peak, self.monitor.seen,
            self.placement.describe() if self.placement else None, self.torchrl.to_dict(self.features), self.extra,
            evaluation=self.eval.describe() if self.eval else None, memory=self.state.memory(),
            actors=getattr(self.collector, "actor_placement", None)))
        self.report.file(self.state.run.path, self.report_dir)


def collector(source, *, variables: dict[str, str] | None = None, spec: str | None = None, allow_edited: bool = False,
              **options: Any) -> Run:
    """A :class:`Run` of ``source``: a spec path, a saved plan's path, or a plan dict (each checked).

    ``variables`` render a Jinja2 spec; ``spec`` is the spec a saved plan came from (the plan is refused
    if it changed); ``allow_edited`` runs a plan whose digest no longer matches. Every other keyword goes
    to :class:`Run` (``policy_factory``, ``policy``, ``report_dir``, ``startup_timeout``, ...) or, if
    :class:`Run` does not take it, to the torchrl collector (``replay_buffer``, ``env_device``, ...).
    """
    return Run(plans.resolve(source, variables, spec, allow_edited=allow_edited), **options)


def _parts(plan: dict[str, Any], policy_factory, policy, collector_kwargs: dict[str, Any]):
    """A run's policy setup, torchrl features and support, engine and policy placement, each checked: raises
    before anything starts when they do not go together."""
    clash = sorted(set(collector_kwargs) & set(RESERVED_KWARGS))
    if clash:
        raise UsageError(f"topo sets {', '.join(clash)} from the plan and the policy placement: change the spec "
                         "(collector, policy sections) or pass policy=/policy_factory= instead")
    setup = PolicySetup.resolve(plan.get("policy"), policy_factory)
    features = boundary.features_of(plan, setup.placement if setup else None)
    torchrl = boundary.support(features)
    refused = torchrl.refusal(features)
    if refused:
        raise LaunchError(refused)
    engine = engine_for(plan, restarts=torchrl.ok("restarts") and torchrl.ok("ray-restarts"))
    if torchrl.ok("replay-buffer-check") and boundary.storage_builds_env_in_trainer(
            collector_kwargs.get("replay_buffer")):
        raise UsageError("this replay buffer's storage is not initialised: torchrl would build subcollector 0's envs "
                         "in the trainer to shape it; use LazyTensorStorage(..., shared_init=True) with "
                         "TensorDictReplayBuffer(..., shared=True), or initialise the storage before the run")
    if policy is not None and setup is None:
        raise UsageError("policy= needs a policy factory to build the copies that act: pass policy_factory= or "
                         "give the spec a policy section")
    if policy is not None and "weight_updates" not in engine.capabilities:
        raise UsageError(f"placement.engine {engine.name} cannot push weights: each subcollector builds its copy from "
                         "the policy factory and keeps its weights (drop policy=)")
    placement = Placement(setup, policy, len(plan["subcollectors"]), collector_acks="collector_acks" in engine.capabilities,
                          weight_sync=engine.weight_sync) if setup else None
    return setup, features, torchrl, engine, placement


def _refuse_nested(active: bool) -> None:
    if active:
        raise UsageError("a topo run is already active in this process: one at a time")
    if os.environ.get(trainer.TRAINER_VAR):
        raise UsageError("topo.collector was called in a process that a run started (a subcollector or the policy "
                         "server): spawned processes import the training script again, so keep its loop under "
                         "`if __name__ == '__main__':`")


def _run_directory(report_dir: str | None, launch: dict[str, Any]) -> str:
    """A new run directory (in ``report_dir``, else a temporary one) holding ``launch.json``."""
    if report_dir:
        os.makedirs(report_dir, exist_ok=True)
    path = tempfile.mkdtemp(prefix="topo-run-", dir=os.path.abspath(report_dir) if report_dir else None)
    with open(os.path.join(path, "launch.json"), "w") as f:
        json.dump(launch, f)
    return path
