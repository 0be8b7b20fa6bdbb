"""A run of a plan in the caller's process: the collector a training loop iterates, with topo's guarantees.

    with topo.collector("spec.yaml", policy_factory=make_policy, policy=policy) as run:
        for batch in run.collector:          # the real torchrl collector
            ...
            run.update_weights()             # every subcollector (or the server) acts with them next
    print(run.report)

``topo launch`` is this, with a loop that collects N batches. :class:`Run` is a facade; each guarantee
lives in its own module: no env outside env workers (:mod:`.subcollector`, :mod:`.policy`); the torchrl it runs
on, checked first (:mod:`.boundary`); the engine that runs the subcollectors (:mod:`.engines`: :mod:`.local`,
:mod:`.ray`); the first failure named, restarts with the plan's rows and teardown within one deadline
(:mod:`.supervision`); the trainer's process state put back (:mod:`.trainer`); the report (:mod:`.report`);
the plan's evaluation in an eval process of its own (:mod:`.evaluation`).
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
from dataclasses import dataclass
from typing import Any, Callable

from topo.errors import LaunchError, UsageError
from topo.runtime import quiet
from topo.runtime.rundir import RunDir
from topo.compiler import saved
from topo import seeding
from topo.launch import boundary, observe, resume, trainer
from topo.launch.digest import BatchDigest, attach
from topo.launch.engines import Engine, engine_for
from topo.launch.evaluation.service import EvalService
from topo.launch.options import RESERVED_KWARGS, Options
from topo.launch.policy import Placement, PolicySetup
from topo.launch.report import Report, recycles, restarts
from topo.runtime.episodes import Episodes
from topo.launch.supervision import failure as failures, teardown, watcher
from topo.launch.supervision.delivery import Delivery
from topo.launch.supervision.monitor import Monitor
from topo.launch.supervision.progress import Progress
from topo.launch.supervision.recovery import Recovery
from topo.launch.supervision.lives import life_plan
from topo.launch.supervision.state import Phase, RunState


class Run:
    """One run of a plan: start it with ``with`` (or :meth:`start`), iterate :attr:`collector`.

    Attributes: ``plan``; ``options`` (:class:`~topo.launch.options.Options`); ``collector`` (the torchrl
    collector, once started); ``report`` (a :class:`~topo.launch.report.Report`, once ended); ``state`` (the run's
    records, once started); ``run_dir``; ``policy_version`` (weight updates pushed so far); ``restarts`` and
    ``recycles`` (subcollectors restarted, or rebuilt past a health budget, so far); ``failure`` (what failed, if
    anything); ``evaluations`` (each evaluation's result so far: :meth:`evaluate`, ``eval.every``); ``digest`` (a
    running sha256 over the batches yielded so far: ``run.digest.hexdigest``; the report's ``batches``); ``resumed``
    (where it started: :class:`~topo.launch.resume.Resumed`, all 0 for a run that resumes none).
    """

    _active: Run | None = None  # the run started in this process and not yet ended

    def __init__(self, plan: dict[str, Any], options: Options | None = None, **given: Any):
        self.plan = plan
        self.options = options if options is not None else Options.of(**given)
        self.wiring = _Wiring.of(plan, self.options)
        self.resumed = _resumed(plan, self.options.resume, self.wiring)
        self.collector = self.report = self.state = self.eval = None
        self.life = _Life(self.options, plan)
        self.extra: dict[str, Any] = {}  # what the caller adds to the report's launch section (the CLI: batches)
        self.digest = BatchDigest()  # every batch the collector yielded, in order (:mod:`.digest`)
        if self.resumed.run_dir is not None:
            self.extra["resumes"] = self.resumed.run_dir

    engine = property(lambda self: self.wiring.engine)
    placement = property(lambda self: self.wiring.placement)
    run_dir = property(lambda self: self.state.run.path if self.state else None)
    failure = property(lambda self: self.life.delivery.failure)
    policy_version = property(lambda self: self.placement.version if self.placement else self.resumed.policy_version)

    @property
    def restarts(self) -> list[dict]:
        """Each subcollector restart so far (``launch.restarts``): the report's ``restarts`` section."""
        return self._read(restarts, [])

    @property
    def recycles(self) -> list[dict]:
        """Each subcollector rebuilt so far past a health budget (``launch.recycle``; no restart budget spent): the
        report's ``recycles`` section."""
        return self._read(recycles, [])

    def time_breakdown(self) -> dict | None:
        """Where the run's time goes so far (:mod:`topo.launch.time_spent`; the report's ``time_breakdown``): env
        steps, inference waits, the server's forward and batch fill, the trainer's share, and a ``verdict``."""
        return _time_breakdown(self) if self.state is not None else None

    def worker_memory(self) -> list[dict]:
        """Each env worker's latest resident memory with its plan row (:meth:`RunState.memory`: ``rss_mb``,
        ``peak_rss_mb``, ``at``...), read from the heartbeat files: cheap enough between batches."""
        return self._read(RunState.memory, [])

    def episodes(self):
        """The episodes recorded so far (:class:`topo.runtime.episodes.Episodes`): every ``topo_episode`` id in the
        batches resolves there to its plan row, worker life, seed state and acting policy versions."""
        if self.state is None:
            raise UsageError("the run has not started: its episodes are recorded once it has")
        return Episodes(self.state.run.path)

    def state_dict(self) -> dict[str, Any]:
        """What a run resumed from this one needs (``topo.collector(plan, resume=state)``): plain JSON, small, to keep
        in your checkpoint beside the weights of the same moment (:mod:`topo.launch.resume`): the plan's parts'
        digests, the next worker life, the eval run's, the evaluation rounds asked for, the policy version and the
        batches delivered so far (the runs' before it included)."""
        if self.state is None:
            raise UsageError("the run has not started: its state exists once it has")
        with self.life.monitor.lock:
            lives = max(s.restart for s in self.state.all_subcollectors()) + 1
        evals = os.path.join(self.state.run.path, "eval", "collector")
        eval_lives = max([self.resumed.eval_lives, *(resume.lives(os.path.join(evals, name)) for name in (
            os.listdir(evals) if os.path.isdir(evals) else []) if name.startswith("topo-run-"))])
        return resume.state(self.plan, self.state.run.path, resume.Resumed(
            lives=lives, eval_lives=eval_lives, eval_rounds=self.resumed.eval_rounds + (self.eval.asked if self.eval else 0),
            policy_version=self.policy_version, batches=self.resumed.batches + self.digest.batches))

    def update_weights(self, policy_or_weights=None) -> int:
        """Push the trainer's policy weights (or ``policy_or_weights``) to every acting copy; the new version. When it
        returns, every copy acts with them, and the rows collected from then on carry it as ``policy_version``."""
        if self.placement is None:
            raise UsageError("this run has no policy to update: give it a policy factory (spec policy section, "
                             "or policy_factory=)")
        self._collecting("weights can be updated")
        with self.life.delivery.interruptible():
            version = self.placement.update(self.collector, policy_or_weights)
        if self.eval is not None and self.eval.due(version):
            self.evaluate(wait=not self.eval.asynchronous, step=version)
        resume.write(self.state.run.path, self.state_dict())
        return version

    def evaluate(self, *, wait: bool = True, step: int | None = None) -> dict[str, Any] | bool | None:
        """Evaluate the trainer's current weights on the plan's eval rows (every planned episode once). ``wait``: block
        and return the result (:mod:`topo.launch.evaluation.results`); else start it in the background and return
        whether it was accepted (``eval.busy_policy``; results gather in :attr:`evaluations`). ``step``: recorded."""
        if self.eval is None:
            raise UsageError("this plan has no eval section: add one to the spec (docs/guides/evaluation.md)")
        self._collecting("evaluation runs")
        weights = self.placement.current_weights() if self.placement else None
        with self.life.delivery.interruptible():
            accepted = self.eval.trigger(weights, version=self.policy_version, step=step)
            out = self.eval.wait() if wait else accepted
        resume.write(self.state.run.path, self.state_dict())
        return out

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
        path = self.wiring.check(self.plan, self.options.report_dir, self.life.shutdown_budget, self.resumed.run_dir)
        self.state = RunState(self.plan, RunDir(path), time.time(), first_life=self.resumed.lives)
        Run._active = self
        quiet.quiet_fd_sharing()  # a subcollector killed while fetching a shared tensor is the run's to name
        self.life.begin(self.state, self.options.report_dir, functools.partial(_on_failure, self))
        try:
            with self.window(self.resumed.lives), self.life.delivery.interruptible():
                self.collector, self.life.recovery = _build(self)
        except BaseException as exc:  # noqa: BLE001 - every way out tears down first
            raised = self._end(exc)
            if raised is exc:
                raise
            raise raised from exc
        if self.plan.get("eval") and self.options.evaluation:  # its eval collector builds while this one collects
            self.eval = EvalService.started(self.plan, self.state.run.path, self.wiring.setup, self.life.startup_timeout,
                                            self.options.process_logs, self.resumed)
        self.life.ready_at = time.time()
        self.state.phase = Phase.COLLECTING
        self.life.log_figures(self.options.logger, self.state.run.path)
        resume.write(self.state.run.path, self.state_dict())

    def window(self, restart: int):
        """The launch window of a start (``restart``: its worker life): what its processes inherit (:mod:`.trainer`)."""
        return trainer.launch_window(self.state.run.path, max_concurrent_starts=self.life.max_concurrent_starts,
                                     process_logs=self.options.process_logs, restart=restart,
                                     record=saved.recording(self.plan),
                                     retain=self.plan["launch"].get("retain_episodes"))

    def close(self, exc: BaseException | None = None) -> BaseException | None:
        """Tear the run down. ``exc`` is what ended it, if anything; returns what the caller should raise
        (``exc`` itself, topo's error naming the failure, or None)."""
        if self.state is None or self.state.phase is Phase.DONE:
            return exc
        return self._end(exc)

    def _collecting(self, what: str) -> None:
        if self.state is None or self.state.phase is not Phase.COLLECTING:
            raise UsageError(f"{what} only while the run collects (inside its with block)")

    def _read(self, read: Callable[[RunState], Any], empty: Any) -> Any:
        if self.state is None:
            return empty
        with self.life.monitor.lock:
            self.state.update()  # the records as of now: a batch the trainer holds was recorded before it was sent
            return read(self.state)

    def _end(self, exc: BaseException | None) -> BaseException | None:
        life = self.life
        life.saved.catch(trainer.ignore_signal)  # teardown runs to its end; it is bounded
        life.error, raised = life.delivery.classify(exc)
        self.state.phase = Phase.SHUTTING_DOWN
        try:
            teardown.run(life.down, teardown.Deadline(life.shutdown_budget), run_path=self.state.run.path,
                         trainer=os.getpid(), graceful=functools.partial(_graceful, self), stop_monitor=life.monitor.stop,
                         watcher=life.watcher)
        finally:
            self.state.phase = Phase.DONE
            life.progress.finish()
            life.close_figures()  # the last reading, before the report may remove the run directory
            self.report = Report.of_run(self)
            self.report.file(self.state.run.path, self.options.report_dir)
            life.saved.restore()
            Run._active = None
        return raised


@dataclass
class _Wiring:
    """What a run is built from, checked together before anything starts: the policy setup, the torchrl features
    it needs and the installed torchrl's support, the engine and the policy placement."""

    setup: PolicySetup | None
    features: Any
    torchrl: Any
    engine: Engine
    placement: Placement | None

    @classmethod
    def of(cls, plan: dict[str, Any], options: Options) -> _Wiring:
        """Raises before anything starts when the plan, the options and the installed torchrl do not go together."""
        collector_kwargs, policy = options.collector_kwargs, options.policy
        clash = sorted(set(collector_kwargs) & set(RESERVED_KWARGS))
        if clash:
            raise UsageError(f"topo sets {', '.join(clash)} from the plan and the policy placement: change the spec "
                             "(collector, policy sections) or pass policy=/policy_factory= instead")
        setup = PolicySetup.resolve(plan.get("policy"), options.policy_factory)
        features = boundary.features_of(plan, setup.placement if setup else None)
        torchrl = boundary.support(features)
        refused = torchrl.refusal(features)
        if refused:
            raise LaunchError(refused)
        engine = engine_for(plan, restarts=torchrl.ok("restarts") and torchrl.ok("ray-restarts"))
        if torchrl.ok("replay-buffer-check") and boundary.storage_builds_env_in_trainer(
                collector_kwargs.get("replay_buffer")):
            raise UsageError("this replay buffer's storage is not initialised: torchrl would build subcollector 0's "
                             "envs in the trainer to shape it; use LazyTensorStorage(..., shared_init=True) with "
                             "TensorDictReplayBuffer(..., shared=True), or initialise the storage before the run")
        if policy is not None and setup is None:
            raise UsageError("policy= needs a policy factory to build the copies that act: pass policy_factory= or "
                             "give the spec a policy section")
        if policy is not None and "weight_updates" not in engine.capabilities:
            raise UsageError(f"placement.engine {engine.name} cannot push weights: each subcollector builds its copy "
                             "from the policy factory and keeps its weights (drop policy=)")
        if "runs_nodes" in engine.capabilities:  # async mode on Ray: each node's actor runs its rows as a Run
            engine.node_run = Run
        if "serves_policy" in engine.capabilities:  # the engine's collector starts the server (async mode)
            if setup is None:
                raise UsageError("collector.mode async serves a policy: give the spec a policy section or policy_factory=")
            engine.policy_setup = setup
            from topo.launch.async_mode import ServedPlacement

            return cls(setup, features, torchrl, engine, ServedPlacement(setup, policy, len(plan["subcollectors"])))
        placement = Placement(setup, policy, len(plan["subcollectors"]), weight_sync=engine.weight_sync,
                              collector_acks="collector_acks" in engine.capabilities) if setup else None
        if placement is not None:
            placement.seed = seeding.derive(seeding.row_seeds(plan), "server")
        return cls(setup, features, torchrl, engine, placement)

    def check(self, plan: dict[str, Any], report_dir: str | None, shutdown_budget: float, resumes: str | None) -> str:
        """Warn, check that the engine and the server can start, and make the run directory (naming the run it
        ``resumes``, if any); its path."""
        for warning in self.torchrl.warnings(self.features):
            print(f"warning: {warning}", file=sys.stderr)
        self.engine.check(plan)
        if self.placement is not None:
            self.placement.check()
        return _run_directory(report_dir, {
            "plan": plan, "policy": self.setup.describe() if self.setup else None,
            "shutdown_timeout": shutdown_budget, "torchrl": self.torchrl.to_dict(self.features), "resumes": resumes})


class _Life:
    """What a started run holds besides its records: its budgets, the monitor that judges failures, the route a
    failure takes to the trainer, restarts, the teardown's record, progress, the trainer's saved process state
    and the watcher; what ended it and when it was ready."""

    def __init__(self, options: Options, plan: dict[str, Any]):
        # with process logs, the processes started get this process's stdout/stderr as a file: progress keeps the terminal
        stream = os.fdopen(os.dup(2), "w", buffering=1) if options.process_logs and options.progress else sys.stderr
        self.progress = Progress(options.progress, stream=stream, collecting=options.progress_while_collecting)
        self.startup_timeout = float(options.startup_timeout or plan["launch"]["startup_timeout"])
        self.max_concurrent_starts = options.max_concurrent_starts or plan["launch"].get("max_concurrent_starts")
        self.shutdown_budget = teardown.shutdown_budget(plan)
        self.delivery, self.down = Delivery(), teardown.Record()
        self.monitor: Monitor | None = None
        self.recovery: Recovery | None = None
        self.saved = self.watcher = self.figures = None
        self.ready_at: float | None = None
        self.error: BaseException | None = None  # what ended the run, as the report states it

    def begin(self, state: RunState, report_dir: str | None, on_failure: Callable) -> None:
        """The trainer's state saved, the watcher and the monitor started."""
        self.saved = trainer.TrainerState.save()
        self.watcher = watcher.start(state.run.path, temporary=report_dir is None)
        self.monitor = Monitor(state, self.startup_timeout, self.progress, on_failure)
        self.saved.catch(trainer.raise_signalled)
        self.monitor.start()

    def log_figures(self, logger: Any, run_path: str) -> None:
        """With a torchrl ``logger``: the run's figures, read from its directory, go there (:mod:`.figures`)."""
        if logger is not None:
            from topo.launch.figures import Figures

            self.figures = Figures(logger, run_path).start()

    def close_figures(self) -> None:
        """The figures' last reading; a logger that fails then is said, and the teardown goes on."""
        try:
            if self.figures is not None:
                self.figures.close()
        except Exception as exc:  # noqa: BLE001 - the report is still written
            print(f"warning: the run's logger failed at its last reading: {type(exc).__name__}: {exc}", file=sys.stderr)


def _time_breakdown(run: Run) -> dict:
    """Per subcollector its env steps and its wait for inference, the server's figures, the trainer's pace, and the
    verdict with its figures: read from the heartbeat files and the server (between batches, not every step)."""
    from topo.launch.time_spent import of_run

    stats = run.placement.server_stats() if run.placement is not None else None
    return of_run(run.state, getattr(run.collector, "pace", None), stats)


def _on_failure(run: Run, found: failures.Failure) -> None:
    """In the monitor's thread: stop what cannot go on, then deliver the failure to the trainer."""
    if run.state.phase is Phase.STARTING:
        # nothing to close yet: ending the processes makes torchrl's constructor return at once
        abort = functools.partial(teardown.abort, run.state.run.path, os.getpid())
        threading.Thread(target=lambda: run.life.down.killed.extend(abort()), name="topo-abort", daemon=True).start()
    run.life.delivery.deliver(found)


def _graceful(run: Run, deadline: teardown.Deadline) -> None:
    """Stopped processes killed; the eval process closes its run; the engine closes envs and subcollectors (or,
    never built, they are ended); then the policy server; then the engine leaves its cluster."""
    down, recovery = run.life.down, run.life.recovery
    down.killed += teardown.end_stopped(run.state.run.path, os.getpid())
    if run.eval is not None:
        run.eval.close(deadline.left() - teardown.shutdown_budget(run.plan, evaluation=False))
    if run.collector is not None:
        down.shutdown_at = time.time()
        down.exit_codes = run.engine.shutdown(run.collector, deadline.left())
        down.shutdown_done = time.time()
        if recovery is not None:
            recovery.close()
    else:
        down.killed += teardown.abort(run.state.run.path, os.getpid())
    try:
        if run.placement is not None:
            run.placement.shutdown(deadline.left("server"))
    finally:
        run.engine.disconnect()


def _build(run: Run) -> tuple[Any, Recovery | None]:
    """In the launch window: the start method, the engine joined, the policy server started, the collector built
    and, with an engine that restarts, handed the run's restart port."""
    plan, life, wiring = run.plan, run.life, run.wiring
    multiprocessing.set_start_method(plan["start_methods"]["subcollectors"], force=True)
    kwargs = dict(run.options.collector_kwargs)
    kwargs.update(observe.hooks_with(kwargs.get("pre_collect_hook"), kwargs.get("post_collect_hook")))
    key = observe.instruction_key(plan["env"]["backend"])
    if kwargs.get("replay_buffer") is not None and key and wiring.engine.name == "local":
        from topo.launch import instruction_bytes  # the subcollectors write a shared buffer: no strings in it

        kwargs["replay_buffer"] = instruction_bytes.Buffer(kwargs["replay_buffer"], key)
    wiring.engine.connect(plan)
    placement = wiring.placement
    if placement is not None:
        placement.start_server(life.startup_timeout - run.state.elapsed(time.time()), run.state.run,
                               actor=plan["placement"].get("server"), on_death=life.monitor.submit, plan=plan)
        kwargs.update(placement.collector_kwargs(run.state.run))
    collector = wiring.engine.build(life_plan(plan, run.resumed.lives), **kwargs)
    attach(collector, run.digest)
    if "restarts" not in wiring.engine.capabilities:
        return collector, None
    recovery = Recovery(run.state, life.monitor, life.delivery, window=run.window,
                        restart_policy=placement.restart_factory if placement else lambda index: None,
                        weights=lambda: placement.sender if placement else None)
    wiring.engine.supervise(collector, recovery)
    return collector, recovery


def _resumed(plan: dict[str, Any], source: Any, wiring: _Wiring) -> resume.Resumed:
    """Where the run starts (:mod:`.resume`), checked against the plan; refused where it cannot continue yet."""
    resumed = resume.read(source, plan)
    if resumed is None or resumed == resume.Resumed():
        return resume.Resumed()
    setup = wiring.setup
    if wiring.engine.name != "local" or "serves_policy" in wiring.engine.capabilities or (
            setup is not None and setup.placement == "server"):
        raise UsageError("resume= continues a run on the local engine with the policy in each subcollector (the copies "
                         "number the weights); Ray, async mode and the inference server do not resume yet")
    if wiring.placement is not None:
        wiring.placement.base_version = resumed.policy_version
    return resumed


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
