"""An evaluation worker's env: its plan row's episodes, in order, one per reset, then idle.

Built in the env worker by :func:`topo.worker.make_env` from an eval row's ``schedule`` (see
docs/reference/plan-format.md, ``eval``): the inner env is the backend's own, built for the task of the
episode it runs (rebuilt in this worker when the next episode is of another task). Each episode resets
with its seed (``set_seed``) and, where the backend has them, its init state. Evaluations are rounds: the
trainer numbers them (``round_of``, read at every reset); once this worker has run its episodes of a
round, each reset gives an *idle* episode (one step, ``eval_episode`` -1, nothing simulated) until the
next round starts. Between rounds (the last one ended: ``round_of`` negative) every reset is idle, so a worker
built then (restarted between rounds) does not run the ended round's episodes again.

Every step carries ``eval_round``, ``eval_episode``, the init state the env says it started from
(``eval_init_state``, -1 where it has none to say) and the episode's running ``eval_success``,
``eval_length``, ``eval_return`` and ``eval_checksum`` (the sum of every numeric observation since its
reset: two runs of one episode that see the same observations have the same checksum): the trainer reads
an episode's result at its last step.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from tensordict import TensorDictBase
from torchrl.data import NonTensor, Unbounded
from torchrl.envs import EnvBase

from topo.compiler.eval_plan import env_key, key_task

FIELDS = {"eval_round": torch.int64, "eval_episode": torch.int64, "eval_init_state": torch.int64,
          "eval_success": torch.bool, "eval_length": torch.int64, "eval_return": torch.float32,
          "eval_checksum": torch.float64}
IDLE = -1


class ScheduledEnv(EnvBase):
    """Runs ``schedule["episodes"]`` (each ``{"episode", "task_id", "init_state_id", "seed", ...}``) in order.

    ``build(env_kwargs)`` makes the inner env of a task from ``schedule["envs"][str(task_id)]``;
    ``round_of()`` is the current evaluation round (0: none yet; -N: round N ended).
    """

    def __init__(self, schedule: Mapping[str, Any], build: Callable[[dict], EnvBase], round_of: Callable[[], int]):
        self._episodes = list(schedule["episodes"])
        self._envs = dict(schedule["envs"])
        self._max_steps = schedule.get("max_episode_steps")
        self._build, self._round_of = build, round_of
        key = env_key(self._episodes[0]["task_id"]) if self._episodes else next(iter(self._envs))
        inner, task = build(self._envs[key]), key_task(key)  # a row without episodes idles in its first task's env
        super().__init__(batch_size=inner.batch_size, device=inner.device)
        self.inner, self._task = inner, task
        self.topo_render_device = getattr(inner, "topo_render_device", None)  # what the worker's marker reports
        self.full_observation_spec = self.inner.full_observation_spec.clone()
        for key, dtype in FIELDS.items():
            self.full_observation_spec[key] = Unbounded(shape=(1,), dtype=dtype, device=self.device)
        self.full_action_spec = self.inner.full_action_spec.clone()
        self.full_reward_spec = self.inner.full_reward_spec.clone()
        self.full_done_spec = self.inner.full_done_spec.clone()
        self._observed = [key for key, spec in self.inner.full_observation_spec.items(True, True)
                          if spec.dtype is not None and not isinstance(spec, NonTensor)]
        self.round = 0
        self._next = len(self._episodes)  # nothing to run before the first round
        self._current: dict | None = None
        self._last: TensorDictBase | None = None
        self.rebuilds = 0  # inner envs built for a later task

    # -- episodes --------------------------------------------------------------------------------
    def _take(self) -> dict | None:
        """The next episode of this round (a new round starts the list again), or None: idle."""
        now = self._round_of()
        if now != self.round:
            self.round, self._next = now, 0
        if self.round <= 0 or self._next >= len(self._episodes):
            return None
        episode = self._episodes[self._next]
        self._next += 1
        return episode

    def _switch(self, task) -> None:
        if task == self._task:
            return
        self.inner.close()
        self.inner = self._build(self._envs[env_key(task)])
        self._task = task
        self.rebuilds += 1

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        episode = self._take()
        if episode is None and self._last is not None:
            out = self._last.clone()
            for key in self.full_done_spec.keys(True, True):
                out.set(key, torch.zeros(self.full_done_spec[key].shape, dtype=torch.bool, device=self.device))
        else:
            if episode is not None:
                self._switch(episode["task_id"])
                if episode.get("init_state_id") is not None:
                    self.inner.topo_set_init_state(episode["init_state_id"])
                self.inner.set_seed(episode["seed"])
            out = self.inner.reset()
        self._current = episode
        self._stats = [False, 0, 0.0, self._checksum(out) if episode is not None else 0.0]
        self._last = out.exclude(*self._done_keys())
        return self._stamp(out)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self._current is None:  # idle: one step, done, nothing simulated
            out = self._last.clone()
            for key in self.full_reward_spec.keys(True, True):
                out.set(key, torch.zeros(self.full_reward_spec[key].shape, device=self.device))
            for key in self.full_done_spec.keys(True, True):
                out.set(key, torch.full(self.full_done_spec[key].shape, key != "terminated", device=self.device))
            return self._stamp(out)
        out = self.inner._step(tensordict)
        success, length, total, checksum = self._stats
        length += 1
        total += float(out.get("reward").sum())
        if "success" in out.keys():
            success = success or bool(out.get("success").any())
        if self._max_steps is not None and length >= self._max_steps and not bool(out.get("done").any()):
            out.set("truncated", torch.ones_like(out.get("done")))
            out.set("done", torch.ones_like(out.get("done")))
        if bool(out.get("done").any()) and "success" not in out.keys():
            success = bool(out.get("terminated", out.get("done")).any())
        self._stats = [success, length, total, checksum + self._checksum(out)]
        self._last = out.exclude(*self._done_keys(), *self.full_reward_spec.keys(True, True))
        return self._stamp(out)

    def _done_keys(self) -> list:
        """The done keys, and ``truncated`` where the spec has none (:meth:`_step` sets it at ``max_episode_steps``):
        an idle episode's observations carry neither (a ``StepCounter`` over this env reads ``truncated``)."""
        return list({*self.full_done_spec.keys(True, True), "truncated"})

    def _checksum(self, out: TensorDictBase) -> float:
        return float(sum(out.get(key).double().sum() for key in self._observed if key in out.keys(True, True)))

    def _stamp(self, out: TensorDictBase) -> TensorDictBase:
        success, length, total, checksum = self._stats
        applied = getattr(self.inner, "topo_init_state", None)
        values = {"eval_round": self.round, "eval_episode": IDLE if self._current is None else self._current["episode"],
                  "eval_init_state": -1 if applied is None else applied,
                  "eval_success": success, "eval_length": length, "eval_return": total, "eval_checksum": checksum}
        for key, dtype in FIELDS.items():
            out.set(key, torch.tensor([values[key]], dtype=dtype, device=self.device))
        return out

    def _set_seed(self, seed: int | None) -> None:
        self.inner.set_seed(seed)

    def close(self, *, raise_if_closed: bool = True) -> None:
        if not self.is_closed:
            self.inner.close()
        super().close(raise_if_closed=raise_if_closed)
