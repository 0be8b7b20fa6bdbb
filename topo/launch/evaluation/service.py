"""The eval process of a training run: an :class:`~topo.launch.evaluate.Evaluation` beside the training collector.

A run holds one collector per process (:class:`~topo.launch.run.Run`), so a training run evaluates in
a process of its own, started from this topo (:func:`topo.runtime.child.command`, not the training script) with
the training run's directory in its environment: if the trainer dies, the training run's watcher ends it,
and its own run's watcher then ends its eval workers. It talks with the trainer over a socket in the run
pair: the trainer sends rounds (weights, version, step), the process answers each with its result;
``close`` ends its run and answers with that run's report.

Like torchrl's ``Evaluator``, a round asked for while one runs is skipped, queued or refused
(``busy_policy``); ``async`` rounds run while the trainer goes on collecting.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from topo.runtime import child
from topo.errors import LaunchError, UsageError
from topo.runtime.rundir import RUN_DIR_VAR
from topo.launch.resume import Resumed
from topo.launch.supervision import processes
from topo.launch.trainer import TRAINER_VAR

BOOT = "from topo.launch.evaluate import serve; sys.exit(serve(sys.argv[1:]))"  # the eval process
BUSY_POLICIES = ("skip", "queue", "error")


class EvalService:
    """The trainer's side: start the eval process, send it rounds, read their results, close it."""

    def __init__(self, plan: dict[str, Any], run_dir: str, *, policy_factory=None, startup_timeout: float | None = None,
                 process_logs: bool = False, resumed: Resumed | None = None):
        """``resumed``: the rounds and eval lives of the runs before (a resumed run's eval continues them)."""
        self.section = plan["eval"]
        self.busy_policy = self.section.get("busy_policy") or "skip"
        self.run_dir = run_dir
        self._init = {"plan": plan, "policy_factory": policy_factory, "out_dir": run_dir,
                      "report_dir": os.path.join(run_dir, "eval", "collector"), "startup_timeout": startup_timeout,
                      "process_logs": process_logs, "resumed": resumed or Resumed()}
        self.results: list[dict[str, Any]] = []
        self.report: dict[str, Any] | None = None  # the eval run's summary, once closed
        self.proc: subprocess.Popen | None = None
        self._conn = None
        self._pending = 0  # rounds sent, not answered
        self._queued: deque = deque()
        self.skipped = 0

    @classmethod
    def started(cls, plan: dict[str, Any], run_dir: str, setup, startup_timeout: float, process_logs: bool,
                resumed: Resumed | None = None) -> EvalService:
        """The eval process of a training run, started (``setup``: the run's policy setup, None: the plan's)."""
        service = cls(plan, run_dir, policy_factory=setup.factory if setup else None, startup_timeout=startup_timeout,
                      process_logs=process_logs, resumed=resumed)
        service.start()
        return service

    @property
    def asynchronous(self) -> bool:
        """``eval.async``: a scheduled evaluation runs in the background, the trainer does not wait for it."""
        return bool(self.section.get("async"))

    def due(self, version: int) -> bool:
        """Whether the update that made weights ``version`` is followed by an evaluation (``eval.every``)."""
        every = self.section.get("every")
        return bool(every) and version % every == 0

    def start(self) -> None:
        """Start the process; it builds its collector while the trainer goes on (the first round waits for it)."""
        ours, theirs = socket.socketpair()
        env = {k: v for k, v in os.environ.items() if k != TRAINER_VAR}
        env[RUN_DIR_VAR] = self.run_dir  # a process of the training run: its teardown and watcher end it
        with open(os.path.join(self.run_dir, "eval.log"), "ab") as log:
            self.proc = subprocess.Popen(child.command(BOOT, str(theirs.fileno())), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=(theirs.fileno(),),
                                         start_new_session=True)  # a Ctrl-C is the trainer's, who closes it in order
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send(self._init)

    def _connection(self) -> Connection:
        if self._conn is None:
            raise UsageError("the eval process is not started")
        return self._conn

    @property
    def asked(self) -> int:
        """Rounds sent to the eval process so far (ended, or running)."""
        return len(self.results) + self._pending

    @property
    def pending(self) -> bool:
        self._read(block=False)
        return bool(self._pending or self._queued)

    def trigger(self, weights, *, version: int, step: int | None) -> bool:
        """Ask for a round with ``weights`` (``torch.save`` bytes of a TensorDict; None: the weights the eval
        policy has); False when skipped (``busy_policy: skip``)."""
        if self.pending:
            if self.busy_policy == "error":
                raise UsageError("an evaluation is still running (eval.busy_policy: error): wait for it, or set "
                                 "busy_policy to skip or queue")
            if self.busy_policy == "skip":
                self.skipped += 1
                return False
            self._queued.append((weights, version, step))
            return True
        self._send(weights, version, step)
        return True

    def _send(self, weights, version: int, step: int | None) -> None:
        conn = self._connection()
        try:
            conn.send({"cmd": "evaluate", "weights": weights, "version": version, "step": step})
        except OSError as exc:  # the eval process ended before this round, its run failed between rounds
            raise self._last_word() from exc
        self._pending += 1

    def _last_word(self) -> LaunchError:
        """The eval process is gone: the failure it sent before it ended (an eval worker that died between rounds,
        restarts off), read from what is left on the socket, else that it ended."""
        conn = self._connection()
        try:
            while conn.poll(0):
                message = conn.recv()
                if "error" in message:
                    return _failed(message)
        except (EOFError, OSError):
            pass
        return LaunchError(self._died())

    def wait(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Block until every round asked for has its result (or ``timeout``); the last result."""
        end = None if timeout is None else time.monotonic() + timeout
        while self._pending or self._queued:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                break
            self._read(block=True, timeout=left)
        return self.results[-1] if self.results else None

    def _read(self, *, block: bool, timeout: float | None = None) -> None:
        if not self._pending:
            return
        conn = self._connection()
        while self._pending and (conn.poll(timeout if block else 0)):
            try:
                message = conn.recv()
            except EOFError as exc:
                raise LaunchError(self._died()) from exc
            if "error" in message:
                raise _failed(message)
            self._pending -= 1
            self.results.append(message["result"])
            if self._queued and not self._pending:
                self._send(*self._queued.popleft())
            block = False

    def _died(self) -> str:
        code = self.proc.poll() if self.proc else None
        return (f"the eval process ended (exit code {code}) before answering: see "
                f"{os.path.join(self.run_dir, 'eval.log')}")

    def describe(self) -> dict[str, Any]:
        """The report's ``evaluation`` section: each round's figures, rounds skipped, the eval run's report."""
        from topo.launch.evaluation.results import brief

        collector = self.report or {}
        return {"rounds": [brief(r) for r in self.results], "skipped": self.skipped,
                "busy_policy": self.busy_policy,
                "collector": {k: collector.get(k) for k in ("ok", "error", "run_dir", "topology", "constructions",
                                                             "env_closes", "processes")} if collector else None}

    def close(self, timeout: float) -> None:
        """End the eval run (its envs closed, its report written) within ``timeout``; then the process."""
        end = time.monotonic() + timeout
        try:
            if self._conn is not None and self.proc.poll() is None:
                self._conn.send({"cmd": "close"})
                while time.monotonic() < end and self._conn.poll(max(0.0, end - time.monotonic())):
                    message = self._conn.recv()
                    if "report" in message:
                        self.report = message["report"]
                        break
                    if "result" in message:
                        self.results.append(message["result"])
        except (EOFError, OSError):
            pass
        finally:
            if self.proc is not None:
                try:
                    self.proc.wait(max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    processes.terminate([self.proc.pid], 3.0, 2.0)
                    self.proc.wait()
            if self._conn is not None:
                self._conn.close()


def _failed(message: dict[str, Any]) -> LaunchError:
    """What the trainer raises for the eval process's failure message (:func:`topo.launch.evaluate._failure`)."""
    return LaunchError(f"evaluation failed: {message['error']}", subcollector=message.get("subcollector"),
                       worker=message.get("worker"), row=message.get("row"), traceback=message.get("traceback"))
