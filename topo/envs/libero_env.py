"""torchrl's ``LiberoEnv`` with topo's builder options (``env.options`` in a spec, ``env["options"]`` in a
plan row), each on by default, each leaving LiberoEnv's observations bit-identical or, for the gripper,
making a soft reset start an episode exactly like a hard one:

- ``model_cache``: the task's compiled MuJoCo model comes from the cache (:mod:`topo.envs.mujoco_cache`)
  at construction and at every hard reset; ``true`` (the default directory), a directory, or ``false``.
- ``skip_unread_renders``: LiberoEnv's reset returns the observation of the last of its ``settle_steps``
  no-op steps, yet robosuite renders every camera at the env reset, at ``set_init_state`` and at each
  settle step (12 frames per camera, 11 of them unread: ~2.5 s on a CPU), and the reset that reads the specs during
  construction renders frames of which only the shape is used. Those frames are skipped
  (:mod:`topo.envs.robosuite_scope`); the frames of the last settle step are rendered. Without settle
  steps nothing is skipped (the init state's frame is then the one read).
- ``reset_gripper``: robosuite's grippers accumulate their command in ``current_action``, zeroed only
  when the gripper model is built; with ``hard_reset: false`` an episode started from the previous one's
  gripper command (qpos off by up to 2.2e-4 from a hard reset, 11 of 4096 pixels at 64 px). Zeroed before
  every reset.
- ``fixtures_by_init_state``: an init state sets qpos and qvel only; LIBERO places the fixtures
  (``model.body_pos``, ``body_quat``) at every reset from numpy's global RNG, which ``set_seed`` seeds per
  worker, so two workers of one GRPO group (same task, same init state, different seeds) started with
  fixtures up to 1.5 cm apart. With the option, each reset draws numpy's global RNG from a stream seeded
  by (suite, task, init state index), chosen before the reset, and gives the worker's own stream back
  untouched afterwards: every reset from one init state starts alike in every worker, different init
  states still differ, and the worker's seed rules everything else. Without init states (native random
  resets) nothing changes.

What the cache did is kept in ``env.topo_model_cache``; frames rendered and skipped while the options
were on (construction and resets, with ``skip_unread_renders``) in ``env.topo_renders``.
"""
from __future__ import annotations

import collections
import contextlib
import zlib
from typing import Any, Iterator, Mapping

import numpy as np
from torchrl.envs import LiberoEnv

from topo.envs import robosuite_scope
from topo.envs.robosuite_scope import Scope, scope


class TopoLiberoEnv(LiberoEnv):
    """``LiberoEnv(**kwargs)`` built and reset under the options ``topo_options`` (see the module)."""

    def __init__(self, *args, topo_options: Mapping[str, Any], topo_cache=None, **kwargs):
        robosuite_scope.install()
        self.topo_options = dict(topo_options)
        self._topo_cache = topo_cache
        self._topo_label = f"{kwargs.get('task_suite')} task {kwargs.get('task_id')}"
        self._topo_reset_results: collections.Counter = collections.Counter()
        self.topo_renders = collections.Counter()  # camera frames "made" and "skipped" by construction and resets
        skip = bool(self.topo_options.get("skip_unread_renders"))
        state = Scope(cache=topo_cache, label=self._topo_label, unread=(lambda: True) if skip else None)
        try:
            with scope(state):
                super().__init__(*args, **kwargs)
        finally:
            self._topo_construction_events = state.cache_events
            self._count_renders(state)

    @property
    def topo_model_cache(self) -> dict[str, Any] | None:
        """The cache's directory, what construction got from it, and the results of later (hard) resets."""
        if self._topo_cache is None:
            return None
        return {"dir": str(self._topo_cache.directory), "construction": self._topo_construction_events,
                "resets": dict(self._topo_reset_results)}

    def _reset(self, tensordict=None, **kwargs):
        if self.topo_options.get("reset_gripper"):
            reset_grippers(self._env.env)
        robosuite_env = self._env.env
        settle = self.settle_steps
        lean = bool(self.topo_options.get("skip_unread_renders")) and settle >= 1
        # robosuite counts a step at its start: the last settle step runs with timestep == settle
        state = Scope(cache=self._topo_cache, label=self._topo_label,
                      unread=(lambda: robosuite_env.timestep < settle) if lean else None)
        with scope(state), self._reset_randomness():
            out = super()._reset(tensordict, **kwargs)
        self._topo_reset_results.update(event["result"] for event in state.cache_events)
        self._count_renders(state)
        stale = sorted(camera for camera in state.skipped if not state.made[camera])
        if stale:
            raise RuntimeError(f"skip_unread_renders: the last settle step rendered no frame of {stale} (a camera "
                               "sampling rate other than the control rate?); set env.options.skip_unread_renders: false")
        return out

    def topo_set_init_state(self, index: int) -> None:
        """Start the next episodes from init state ``index`` (an eval episode's, :mod:`topo.envs.scheduled`)."""
        self.init_state_mode, self.init_state_id = "fixed", int(index)

    @property
    def topo_init_state(self) -> int | None:
        """The init state the current episode started from (None: native random resets)."""
        return self._current_init_state_index

    _topo_chosen: tuple | None = None  # the init state chosen ahead of LiberoEnv's reset, for it to take

    @contextlib.contextmanager
    def _reset_randomness(self) -> Iterator[None]:
        """With ``fixtures_by_init_state``: numpy's global RNG seeded by the episode's init state for the reset."""
        if not self.topo_options.get("fixtures_by_init_state") or self.init_states is None:
            yield
            return
        # LiberoEnv picks the init state after robosuite's reset has placed the fixtures: pick it first
        self._topo_chosen = (super()._select_init_state(),)
        saved = np.random.get_state()
        np.random.seed(reset_seed(self.task_suite, self.task_id, self._current_init_state_index))
        try:
            yield
        finally:
            np.random.set_state(saved)
            self._topo_chosen = None

    def _select_init_state(self):
        if self._topo_chosen is not None:
            return self._topo_chosen[0]
        return super()._select_init_state()

    def _count_renders(self, state: Scope) -> None:
        self.topo_renders += collections.Counter(made=sum(state.made.values()), skipped=sum(state.skipped.values()))


def reset_seed(suite: str, task_id: int, init_state: int) -> "np.ndarray":
    """The seed of a reset from ``init_state`` of ``suite``'s task ``task_id`` (four uint32 words)."""
    return np.random.SeedSequence([zlib.crc32(str(suite).encode()), int(task_id), int(init_state)]).generate_state(4)


def reset_grippers(robosuite_env) -> None:
    """Zero every gripper's accumulated command, as a newly built gripper model has it."""
    for robot in robosuite_env.robots:
        grippers = robot.gripper.values() if isinstance(robot.gripper, dict) else [robot.gripper]
        for gripper in grippers:
            if getattr(gripper, "current_action", None) is not None:
                gripper.current_action = np.zeros(gripper.dof)
