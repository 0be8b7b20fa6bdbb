"""Evaluation: the plan's eval rows as a collector of their own, run in rounds, every episode accounted for.

:func:`run_plan` turns a plan's ``eval`` section into a plan a :class:`~topo.launch.run.Run` runs, so
an eval collector has every guarantee a training one has (no env outside env workers, the startup
deadline, the failing worker named with its row, restarts from its rows, teardown). Each eval worker is a
:class:`~topo.envs.scheduled.ScheduledEnv` running its row's episodes once per round.

:class:`Evaluation` owns that run: :meth:`Evaluation.evaluate` pushes the weights, starts a round and
reads batches until every planned episode has ended once (an episode a restarted worker runs again counts
once), then summarises (:mod:`topo.launch.evaluation.results`). ``topo eval`` runs it in its own process;
a training run runs it in an eval process (:mod:`topo.launch.evaluation.service` starts it; :func:`serve`
runs there).

torchrl's ``Evaluator`` counts trajectories over all envs and keeps its collector's iterator between
evaluations, so it cannot promise that each (task, init state) runs exactly ``trials`` times with the
weights of that evaluation: see docs/guides/evaluation.md.
"""
from __future__ import annotations

import copy
import os
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch

from topo.diagnostics import ids_text
from topo.errors import LaunchError, UsageError
from topo.runtime.episodes import KEY as episode_key, episode_id
from topo.runtime.rundir import RUN_DIR_VAR, set_eval_round
from topo.launch import checkpoint
from topo.launch.evaluation import results as eval_results
from topo.launch.policy import PolicySetup, build
from topo.launch.resume import Resumed

#: steps each eval worker takes per collected batch: small, so a round ends close to its last episode
STEPS_PER_BATCH = 8
EXPLORATION = {"deterministic": "DETERMINISTIC", "random": "RANDOM", "mode": "MODE", "mean": "MEAN"}
FINISHED = ("eval_episode", "eval_round", "eval_init_state", "eval_success", "eval_length", "eval_return",
            "eval_checksum")


def run_plan(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan of ``plan``'s eval collector: its eval rows as subcollectors, sync batches, the policy as
    ``eval.policy`` places it (a copy in each eval subcollector, or one inference server of its own for them),
    and under Ray one actor per eval subcollector."""
    section = plan["eval"]
    out = {key: copy.deepcopy(value) for key, value in plan.items() if key not in ("eval", "subcollectors", "coverage")}
    subs = []
    for sub in section["subcollectors"]:
        rows = [{**row, "instruction": None, "group": None, "seed": row["kwargs"]["seed"]} for row in sub["workers"]]
        subs.append({**sub, "workers": rows})
    workers = sum(len(sub["workers"]) for sub in subs)
    out.update(name=f"{plan['name']} [eval]", subcollectors=subs, groups=None,
               collector={"sync": True, "frames_per_batch": STEPS_PER_BATCH * workers, "total_frames": -1})
    if out.get("policy"):
        out["policy"] = {**out["policy"], "placement": "server" if section.get("policy") == "server" else "subcollector"}
    placement = out.get("placement")
    if placement and placement["engine"] == "ray":
        # under Ray, each eval subcollector asks for placement.resources (the overrides name training subcollectors:
        # their pinned resources are held by the training's actors); a server of the eval's own, for placement.server
        if not placement.get("default"):
            raise UsageError("this plan was saved by a topo that did not place eval actors on Ray: compile it again "
                             "(topo plan SPEC -o plan.json)")
        served = (out.get("policy") or {}).get("placement") == "server"
        out["placement"] = {**placement, "subcollectors": [placement["default"]] * len(subs),
                            "server": placement.get("server") if served else None}
    return out


class Evaluation:
    """An eval collector and its rounds. ``with Evaluation(plan, ...) as ev: result = ev.evaluate(weights)``.

    ``policy_factory`` replaces the plan's; ``out_dir`` receives each round's JSON (``eval/round-NNN.json``)
    and ``eval/results.json``; ``rounds_before``: rounds the runs before ran (a resumed training run's: the first
    round here is the next); other keywords go to the :class:`~topo.launch.run.Run`.
    """

    def __init__(self, plan: dict[str, Any], *, policy_factory: str | Callable | None = None,
                 out_dir: str | None = None, rounds_before: int = 0, **run_options: Any):
        from torchrl.envs.utils import ExplorationType

        from topo.launch.run import Run

        if not plan.get("eval"):
            raise UsageError("this plan has no eval section: add one to the spec (docs/guides/evaluation.md)")
        self.section = plan["eval"]
        self.plan = run_plan(plan)
        setup = PolicySetup.resolve(self.plan.get("policy"), policy_factory)
        if setup is None:
            raise UsageError("evaluation needs a policy: give the spec a policy section, or --policy MODULE:CALLABLE")
        # the trainer-side copy that weights are loaded into and pushed from (a policy, never an env)
        self.policy = build(setup.factory, setup.kwargs)
        exploration = getattr(ExplorationType, EXPLORATION[self.section.get("exploration") or "deterministic"])
        self.run = Run(self.plan, policy_factory=policy_factory, policy=self.policy, exploration_type=exploration,
                       **run_options)
        self.out_dir = out_dir
        self.rounds_before = rounds_before
        self.results: list[dict[str, Any]] = []
        self._batches = None

    def __enter__(self) -> Evaluation:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return self.run.__exit__(exc_type, exc, tb)

    def start(self) -> None:
        self.run.start()
        self._batches = iter(self.run.collector)

    def close(self, exc: BaseException | None = None) -> BaseException | None:
        return self.run.close(exc)

    @property
    def report(self):
        return self.run.report

    def evaluate(self, weights=None, *, version: int | None = None, step: int | None = None) -> dict[str, Any]:
        """One round: every planned episode once, acting with ``weights`` (a TensorDict or a module; None: the
        weights of the round before, or the factory's). ``version`` and ``step`` are the trainer's, recorded."""
        number = self.rounds_before + len(self.results) + 1
        if weights is not None:
            self.policy_weights(weights)
        acting = self.run.update_weights()
        self._set_round(number)
        started = time.monotonic()
        planned = {ep["episode"]: (sub["index"], row["index"], ep)
                   for sub in self.section["subcollectors"] for row in sub["workers"] for ep in row["episodes"]}
        ended: dict[int, dict[str, Any]] = {}
        batches, bound, restarts = 0, _batch_bound(self.section), len(self.run.restarts)
        while len(ended) < len(planned):
            batch = next(self._batches)
            batches += 1
            if len(self.run.restarts) != restarts:  # a restarted worker runs its episodes again: count anew
                batches, restarts = 1, len(self.run.restarts)
            for episode in finished(batch, number):
                ended.setdefault(episode["episode"], episode)
            if bound is not None and batches > bound and len(ended) < len(planned):
                missing = sorted(set(planned) - set(ended))
                rows = sorted({planned[e][:2] for e in missing})
                raise LaunchError(f"evaluation round {number}: episodes {ids_text(missing)} never ended in "
                                  f"{batches} batches (eval workers {rows}, as (subcollector, worker))")
        self._set_round(-number)  # ended: a worker restarted from now on waits for the next round
        result = eval_results.summarise(self.section, planned, ended, round_=number, step=step, version=version,
                                        acting_version=acting, seconds=time.monotonic() - started)
        self.results.append(result)
        if self.out_dir:
            eval_results.write(self.out_dir, result, self.results)
        return result

    def _set_round(self, number: int) -> None:
        set_eval_round(self.run.state.run, number)
        self.run.engine.set_eval_round(self.run.collector, number)

    def between_rounds(self):
        """A wait while no round runs (the eval process's, for its next command) that the eval run's failure ends,
        raising topo's error for it, as it ends a wait within a round: an eval worker that died between rounds,
        restarts off, ends the eval run then, not at the next round."""
        return self.run.life.delivery.interruptible()

    def policy_weights(self, weights) -> None:
        """Load ``weights`` (a TensorDict, a state dict, a module, or either saved by ``torch.save`` as bytes or
        a file, read as data: :func:`topo.launch.checkpoint.load`) into the copy the next round pushes."""
        from tensordict import TensorDict, TensorDictBase

        if isinstance(weights, (bytes, str)):
            checkpoint.into(self.policy, weights)
            return
        if isinstance(weights, torch.nn.Module):
            weights = TensorDict.from_module(weights).data
        elif not isinstance(weights, TensorDictBase):
            self.policy.load_state_dict(weights)
            return
        with torch.no_grad():
            TensorDict.from_module(self.policy).data.update_(weights)


def finished(batch, number: int) -> list[dict[str, Any]]:
    """The eval episodes of round ``number`` that end in ``batch`` (its last step's figures)."""
    nxt = batch.get("next")
    done = nxt.get("done").reshape(-1)
    fields = {key: nxt.get(key).reshape(-1) for key in FINISHED}
    versions = batch.get("policy_version", None)
    versions = versions.reshape(-1) if versions is not None else None
    ids = batch.get(episode_key, None)
    ids = ids.reshape(-1) if ids is not None else None
    mask = done & (fields["eval_round"] == number) & (fields["eval_episode"] >= 0)
    out = []
    for i in mask.nonzero().reshape(-1).tolist():
        applied = int(fields["eval_init_state"][i])
        out.append({"episode": int(fields["eval_episode"][i]), "init_state_applied": None if applied < 0 else applied,
                    "success": bool(fields["eval_success"][i]),
                    "length": int(fields["eval_length"][i]), "return": float(fields["eval_return"][i]),
                    "checksum": float(fields["eval_checksum"][i]),
                    "acting_version": int(versions[i]) if versions is not None else None,
                    "episode_id": episode_id(int(ids[i])) if ids is not None and int(ids[i]) >= 0 else None})
    return out


def _batch_bound(section: dict[str, Any]) -> int | None:
    """Batches a round may take at most when every episode has a horizon (None: no horizon, no bound)."""
    horizon = section.get("max_episode_steps")
    if horizon is None:
        return None
    longest = max((len(row["episodes"]) for sub in section["subcollectors"] for row in sub["workers"]), default=0)
    # each episode takes at most horizon steps and its reset; the round's start waits one idle step
    return 2 + (longest * (horizon + 1)) // STEPS_PER_BATCH


def serve(argv: list[str]) -> int:
    """The eval process of a training run (:mod:`.eval_service` starts it): connect, build the eval run,
    answer rounds until ``close`` (or the trainer is gone)."""
    conn = Connection(int(argv[0]))
    init = conn.recv()
    os.environ.pop(RUN_DIR_VAR, None)
    resumed = init["resumed"]  # the eval run's lives start after the lives before, as the training run's do
    evaluation = Evaluation(init["plan"], policy_factory=init["policy_factory"], out_dir=init["out_dir"],
                            report_dir=init["report_dir"], progress=False, startup_timeout=init["startup_timeout"],
                            process_logs=init["process_logs"], rounds_before=resumed.eval_rounds,
                            resume=Resumed(lives=resumed.eval_lives))
    error: BaseException | None = None
    try:
        evaluation.start()
        while True:
            try:
                with evaluation.between_rounds():
                    message = conn.recv()
            except EOFError:  # the trainer is gone
                break
            if message["cmd"] == "close":
                break
            result = evaluation.evaluate(message["weights"], version=message["version"], step=message["step"])
            conn.send({"result": result})
    except BaseException as exc:  # noqa: BLE001 - the trainer hears of it, then the run tears down
        error = exc
        _send(conn, _failure(exc))
    raised = evaluation.close(error)
    report = evaluation.report.data if evaluation.report is not None else None
    _send(conn, {"report": report})
    return 0 if raised is None else 1


def _failure(exc: BaseException) -> dict[str, Any]:
    """What the trainer raises: the eval run's failure, its eval worker and row (episodes as their numbers)."""
    if not isinstance(exc, LaunchError):
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    row = {k: v for k, v in (exc.row or {}).items() if k not in ("kwargs", "episodes") and v is not None}
    if exc.row and exc.row.get("episodes"):
        row["episodes"] = ids_text(e["episode"] for e in exc.row["episodes"])
    return {"error": str(exc), "subcollector": exc.subcollector, "worker": exc.worker, "row": row or None,
            "traceback": exc.traceback}


def _send(conn, message: dict) -> None:
    try:
        conn.send(message)
    except OSError:
        pass
