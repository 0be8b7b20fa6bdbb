"""A drop-in for torchrl's vla_grpo recipe (pytorch/rl ``sota-implementations/vla_grpo``, read at commit
ae9719f17b1517af5c2523a36c4616f003ee55cf): ``make_collector`` with the recipe's signature and return value,
built from a topo plan. The switch is one import in ``vla-grpo.py``::

    from topo.recipes.vla_grpo import make_collector      # instead of utils.make_collector

    collector, policy_server, eval_policy = make_collector(cfg, policy, rollout_device, tokenizer=tokenizer,
                                                           replay_buffer=replay_buffer)

- **the plan**: ``spec=`` (a spec's path), else the ``TOPO_VLA_GRPO_SPEC`` environment variable, else the spec
  ``topo import vla-grpo`` writes from ``cfg`` itself (:mod:`topo.importers.vla_grpo`). Its policy runs on topo's
  inference server (``placement: server``) on ``device``, built by the spec's ``policy.factory``, or
  ``policy_factory=``, or else from a copy of ``policy`` (the trainer's, as it is when this is called).
- **collector**: the run's torchrl collector (``run.collector``: ``start()``, ``pause()``, ``map_fn``...), started
  with the recipe's ``replay_buffer`` (shared: topo refuses a storage it would have to build an env to shape),
  which it extends with whole trajectories, as the recipe's does (``trajs_per_batch=1``, ``traj_format="cat"``:
  the buffer's GRPO transform reads whole ones), and supervised: restarts, hangs, provenance per row. Its ``shutdown()``, which the recipe calls in its ``finally``,
  tears the whole run down (workers, subcollectors, the server) and prints its report (``collector.run.report``);
  the run's failure, if any, is raised there (topo's error, naming the worker and its row).
- **policy_server**: what the recipe's ``sync_policy_server`` calls: ``update_model_weights(weights)`` pushes them
  through ``run.update_weights`` (a partial TensorDict, the recipe's ``trainable_only``, included): when it
  returns, the server acts with them and the rows collected next carry the new ``policy_version``.
  ``shutdown()`` and ``transport.close()`` end the same run (whichever comes first; the others do nothing).
- **eval_policy**: a copy of the trainer's policy in this process, given each synced weight as the server is (the
  recipe's own is a client of its server, acting with the weights last synced): what the recipe's ``Evaluator``
  calls. The recipe's evaluator still builds its eval env in the trainer's process; a plan with an ``eval`` section
  evaluates in topo's eval subcollectors instead (``collector.run.evaluate()``, docs/guides/evaluation.md).

Keywords beyond the recipe's (``spec``, ``policy_factory``, and any of :func:`topo.collector`'s, e.g.
``report_dir``) have defaults, so the recipe's call is unchanged. Imports torch (the runtime half).
"""
from __future__ import annotations

import copy
import io
import os
import sys
import tempfile
from typing import Any, Callable

SPEC_VAR = "TOPO_VLA_GRPO_SPEC"


def make_collector(cfg: Any, policy: Any, device: Any = None, *, tokenizer: Any = None, replay_buffer: Any,
                   post_collect_hook: Callable | None = None, spec: str | os.PathLike | None = None,
                   policy_factory: str | Callable | None = None, **options: Any) -> tuple[Any, Any, Any]:
    """``(collector, policy_server, eval_policy)``, as the recipe's ``make_collector`` returns them, from a topo plan
    (see the module docstring). ``tokenizer`` is the recipe's object: a plan's ``env.transforms`` build their own
    from its values (:func:`action_tokens`), so it is not used. The run has started when this returns."""
    import topo

    plan = served(plan_of(cfg, spec), device)
    if post_collect_hook is not None:
        options["post_collect_hook"] = post_collect_hook
    factory = policy_factory if policy_factory is not None else (
        None if plan["policy"].get("factory") != SERVED_COPY else ServedCopy(policy))
    options.setdefault("progress", False)
    for key, value in RECIPE_COLLECTOR.items():  # the recipe's Collector writes whole trajectories to its buffer
        options.setdefault(key, value)
    eval_policy = copy.deepcopy(policy) if policy is not None else None  # before the start: nothing to undo
    run = topo.collector(plan, policy=policy, policy_factory=factory, replay_buffer=replay_buffer, **options)
    run.start()  # raises what went wrong, after its own teardown
    return Collector(run), PolicyServer(run, eval_policy), eval_policy


SERVED_COPY = "topo.recipes.vla_grpo:served_copy"
#: the recipe's Collector keywords a topo plan does not decide: its replay transform (MCAdvantage) reads whole
#: trajectories, so each subcollector writes one finished trajectory at a time, concatenated
RECIPE_COLLECTOR = {"trajs_per_batch": 1, "traj_format": "cat"}


def plan_of(cfg: Any, spec: str | os.PathLike | None = None) -> dict[str, Any]:
    """The plan dict: of ``spec``, else of ``$TOPO_VLA_GRPO_SPEC``, else of the spec imported from ``cfg`` (written
    next to it in a temporary folder, as ``topo import vla-grpo`` would write it: its path is printed)."""
    import topo

    spec = spec or os.environ.get(SPEC_VAR) or None
    if spec is None:
        spec = imported_spec(cfg)
        print(f"topo: the spec imported from the recipe's config: {spec}", file=sys.stderr)
    return topo.compile_spec(os.fspath(spec))


def imported_spec(cfg: Any) -> str:
    """``topo import vla-grpo`` of ``cfg`` (an OmegaConf config or a dict, resolved), as a spec file's path."""
    import yaml

    from topo.importers import hydra
    from topo.importers.vla_grpo import convert

    data = cfg
    if not isinstance(cfg, dict):
        from omegaconf import OmegaConf  # the recipe's cfg: Hydra's

        data = OmegaConf.to_container(cfg, resolve=True)
    folder = tempfile.mkdtemp(prefix="topo-vla-grpo-")
    config_path, spec_path = os.path.join(folder, "config.yaml"), os.path.join(folder, "spec.yaml")
    with open(config_path, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    imported = convert(hydra.read(config_path), "config.yaml")
    with open(spec_path, "w") as f:
        f.write(imported.text)
    return spec_path


def action_tokens(vocab_size: int, low: float = -1.0, high: float = 1.0) -> Any:
    """The recipe's token decoding as an env transform (``env.transforms``, after ``MultiAction``): torchrl's
    ``ActionTokenizerTransform`` over a ``UniformActionTokenizer`` of ``vocab_size`` bins a dimension on
    ``[low, high]``, the tokenizer the recipe's ``make_action_tokenizer`` gives every policy but OpenVLA's. Its
    inverse decodes the policy's ``("vla_action", "tokens")`` into the chunk ``MultiAction`` unbinds."""
    from torchrl.data.vla import UniformActionTokenizer
    from torchrl.envs import ActionTokenizerTransform

    return ActionTokenizerTransform(UniformActionTokenizer(vocab_size, low=low, high=high))


def served(plan: dict[str, Any], device: Any = None) -> dict[str, Any]:
    """``plan`` with its policy on topo's inference server (the recipe's ``ProcessInferenceServer``): the spec's
    policy factory and kwargs kept (none: a copy of the trainer's policy), ``device`` the server's unless the spec
    names one."""
    section = dict(plan.get("policy") or {})
    section.setdefault("factory", None)
    if section["factory"] is None:
        section.update(factory=SERVED_COPY, kwargs={})
    section["placement"] = "server"
    if section.get("device") is None and device is not None:
        section["device"] = str(device)
    section.setdefault("kwargs", {})
    section.setdefault("weight_sync", "shared_mem")  # a plan names it; with a server, weights go to the server
    return {**plan, "policy": section}


def served_copy() -> Any:
    """The factory a plan names when the server's policy is a copy of the trainer's: :class:`ServedCopy` stands in
    for it (given as ``policy_factory``); called by name, it has nothing to copy."""
    from topo.errors import UsageError

    raise UsageError("served_copy is given by make_collector as policy_factory=ServedCopy(policy): pass a policy")


class ServedCopy:
    """A policy factory that builds, where the server runs, a copy of the trainer's policy as it was when made: the
    module pickled once (its own bytes: the trainer's parameters never go to shared memory)."""

    def __init__(self, policy: Any):
        import torch

        self.__qualname__ = "served_copy"  # what the run's launch.json and report name (pickle reads the class's)

        buffer = io.BytesIO()
        torch.save(copy.deepcopy(policy).cpu(), buffer)
        self.blob = buffer.getvalue()

    def __call__(self) -> Any:
        import torch

        # the trainer's own policy, written by this trainer a moment ago for its own server (not a file read back)
        return torch.load(io.BytesIO(self.blob), weights_only=False)


class Collector:
    """The run's torchrl collector, as the recipe uses it (``start``, ``pause``, ``map_fn``, ...: every attribute is
    the collector's), except ``shutdown()``: the run torn down. ``run`` is the :class:`topo.Run`."""

    def __init__(self, run: Any):
        self.run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run.collector, name)

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        close(self.run)


class PolicyServer:
    """What the recipe's ``sync_policy_server`` and its ``finally`` call on its ``ProcessInferenceServer``."""

    def __init__(self, run: Any, eval_policy: Any = None):
        self.run, self.eval_policy = run, eval_policy
        self.transport = _Transport(run)

    def update_model_weights(self, weights: Any) -> int:
        """Push ``weights`` (a TensorDict of the policy's, or a part of it) to the server; the new version."""
        version = self.run.update_weights(weights)
        if self.eval_policy is not None:
            assign(self.eval_policy, weights)
        return version

    def stats(self, timeout: float = 1.0) -> dict | None:
        """The server's figures (torchrl's ``stats()``)."""
        return self.run.placement.server_stats(timeout) if self.run.placement is not None else None

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        close(self.run)


def assign(module: Any, weights: Any) -> None:
    """``weights`` (a TensorDict of ``module``'s, or a part of it) into ``module`` in place. A tensor of another
    shape replaces the module's: a lazy layer (TinyVLA's) is materialised by the trainer's first forward, after
    the copy was made or synced."""
    import torch
    from torch.nn.parameter import UninitializedTensorMixin

    with torch.no_grad():
        for name, value in weights.flatten_keys(".").items():
            owner_name, _, attr = name.rpartition(".")
            current = getattr(module.get_submodule(owner_name), attr)
            if isinstance(current, UninitializedTensorMixin):
                current.materialize(value.shape, device=current.device, dtype=value.dtype)
            if current.shape != value.shape:
                current.data = value.detach().clone().to(current.device)
            else:
                current.copy_(value)


class _Transport:
    def __init__(self, run: Any):
        self.run = run

    def close(self) -> None:
        close(self.run)


def close(run: Any) -> None:
    """End ``run`` once (later calls do nothing) and print its report on stderr. Called in a ``finally`` while an
    exception propagates, that exception is the run's end; topo's error naming a failure is raised in its place,
    else nothing."""
    ending = sys.exc_info()[1]
    open_ = getattr(run, "report", None) is None
    raised = run.close(ending)
    if open_ and getattr(run, "report", None) is not None:  # the recipe has no place for it: topo's report, said
        print(run.report, file=sys.stderr)
    if raised is not None and raised is not ending:
        raise raised
