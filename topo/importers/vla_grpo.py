"""``topo import vla-grpo``: a topo spec from torchrl's vla_grpo recipe config (Hydra,
``sota-implementations/vla_grpo/config/vla_grpo_libero.yaml``) whose plan is the recipe's assignment,
worker for worker (docs/reference/spec.md, "The assignment").

Every key of the config is accounted for: written into the spec with a comment naming it, read and found
equal to topo's default, or named as something a topo spec does not express (the training loop's: policy,
inference server, replay). Keys this importer does not know are reported, never guessed at.

The recipe's evaluation (``env.eval_*``, ``logger.eval_*``) becomes the spec's ``eval`` section, with two
deliberate differences, said in the spec and on stderr: its eval seed ``env.seed + 1`` is training worker
1's, so the eval seeds start after the training ones instead; and it evaluates its training tasks, which
topo keeps but warns about (``eval-on-train-tasks``: held-out tasks are the alternative).

The recipe's chunk-decision stack (``env.chunk_size``, ``env.max_outer_steps``, and for a token policy
``tokenizer.vocab_size``) becomes ``env.transforms`` in each worker (``transforms_at: worker``, the default): the
recipe's collector wraps each worker's env, not its ParallelEnv (:func:`_transforms`).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Callable

from topo.diagnostics import Diagnostic, error, warning
from topo.errors import SpecError
from topo.importers.hydra import RESOLVE_HINT, Config, _get
from topo.importers.writer import document, flow

INIT_STATE_MODES = ("random", "cycle", "fixed")

#: env and collector keys the recipe reads that a spec does not express, with why
LEFT_OUT = {
    ("env", "num_envs"): "the recipe's standalone make_env path (training runs num_collectors x envs_per_collector)",
    **{("env", key): "ToyVLAEnv's (env.backend toy), unused with libero"
       for key in ("action_dim", "state_dim", "image_shape", "render_size", "success_steps", "success_tol")},
    **{("collector", key): "the training loop's replay target and cadence"
       for key in ("groups_per_iter", "min_replay_decisions", "total_iters", "replay_wait_s", "replay_log_s")},
    **{("collector", key): "the policy inference server and its clients"
       for key in ("policy_device", "policy_micro_batch_size", "server_max_batch_size", "server_min_batch_size",
                   "server_timeout", "server_collect_stats", "server_stats_window_size", "max_inflight_per_env")},
    **{("collector", key): "threads and storage of the recipe's outer Collector"
       for key in ("num_threads", "env_sub_threads", "storing_device")},
    ("collector", "use_buffers"): "the outer Collector's buffers (topo's launch.use_buffers is the ParallelEnv's, "
                                  "false with worker metadata, as in the recipe)",
    ("logger", "eval_backend"): "where the recipe's Evaluator runs (topo evaluates in its own eval subcollectors)",
    ("logger", "eval_timeout_s"): "how long the recipe waits for an evaluation's result",
    ("logger", "eval_device"): "the device of the recipe's eval policy (topo: policy.device)",
}
BUSY_POLICIES = ("skip", "queue", "error")
ACTION_TOKENS = "topo.recipes.vla_grpo:action_tokens"  # the recipe's uniform token decoding, as a transform
#: whole sections a spec does not express (the keys topo maps from policy and logger are taken out first)
SECTIONS = {
    "tokenizer": "the action tokenizer", "policy": "the policy", "advantage": "the GRPO advantage and selection",
    "buffer": "the replay buffer", "loss": "the loss", "optim": "the optimizer", "train": "the weight sync",
    "logger": "logging", "checkpoint": "checkpoints", "hydra": "Hydra's own settings",
}


@dataclass
class Imported:
    """The spec text and what the import has to say about the config."""

    text: str
    warnings: list[Diagnostic]  # located: unknown keys, settings a spec cannot carry
    left_out: list[tuple[str, list[str]]]  # (why, keys) for the keys a spec does not express, also closing the spec
    written: int  # config keys written into the spec
    defaults: int  # config keys equal to topo's defaults
    differs: list[str] = field(default_factory=list)  # where the spec deliberately differs from the recipe, and why

    def left_out_lines(self) -> list[str]:
        """The keys not expressed, one line per reason; a training section's as ``20 policy keys``."""
        out = []
        for why, keys in self.left_out:
            section = keys[0].split(".")[0]
            whole = why == SECTIONS.get(section) and len(keys) > 3
            out.append(f"{f'{len(keys)} {section} keys' if whole else ', '.join(keys)}: {why}")
        return out


@dataclass
class _Reader:
    """Typed reads of config keys: each read marks the key as accounted for; problems are collected, located."""

    config: Config
    used: set = field(default_factory=set)  # keys read
    written: set = field(default_factory=set)  # keys whose value a spec entry carries
    defaults: list = field(default_factory=list)  # "key: value (why)" for keys equal to topo's defaults
    errors: list = field(default_factory=list)

    def get(self, path: tuple, valid: Callable[[Any], bool], what: str, required: bool = True, default: Any = None):
        self.used.add(path)
        value, found = _get(self.config.data, path)
        dotted = ".".join(path)
        if not found:
            if required:
                self.errors.append(error("import-missing-key", f"the recipe reads {dotted}, which this config lacks",
                                         path, f"add it to the config, or --set +{dotted}=..."))
            return default
        if path in self.config.unresolved:
            self.errors.append(error("import-interpolation", f"{dotted}: cannot resolve "
                                     f"{self.config.unresolved[path]}", path, RESOLVE_HINT))
            return default
        if not valid(value):
            self.errors.append(error("import-type", f"{dotted} must be {what}, got {value!r}", path))
            return default
        return value

    def origin(self, path: tuple, note: str = "") -> str:
        """A comment naming the key, and --set when the command line gave its value."""
        self.written.add(path)
        return ".".join(path) + note + (" (--set)" if path in self.config.overridden else "")

    def default(self, path: tuple, value: Any, why: str) -> None:
        """A key read and left out of the spec because topo's default is the same."""
        self.used.add(path)
        self.defaults.append(f"{'.'.join(path)}: {flow(value)} ({why})")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(v: Any) -> bool:
    return _is_int(v) and v > 0


def _ints(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(_is_int(x) and x >= 0 for x in v)


def convert(config: Config, name: str) -> Imported:
    """The spec for ``config`` (already overridden and resolved); ``name`` is the config's file name.
    Raises :class:`SpecError` when a key the recipe needs is missing or of the wrong type."""
    r = _Reader(config)
    v = _read(r)
    o = r.origin
    entries: list[tuple[tuple, Any, str | None]] = [
        (("version",), 1, None),
        (("name",), v["exp_name"] or "vla-grpo", o(("logger", "exp_name")) if v["exp_name"] else None),
        (("env", "backend"), "libero", o(("env", "backend"))),
        (("env", "kwargs", "task_suite"), v["suite"], o(("env", "task_suite"))),
        (("env", "kwargs", "camera_height"), v["height"], o(("env", "camera_height"))),
        (("env", "kwargs", "camera_width"), v["width"], o(("env", "camera_width"))),
        (("env", "kwargs", "max_episode_steps"), v["max_steps"], o(("env", "max_env_steps"))),
    ]
    if v["env_kwargs"]:
        entries.append((("env", "kwargs", "env_kwargs"), v["env_kwargs"], o(("env", "env_kwargs"))))
    else:
        r.default(("env", "env_kwargs"), v["env_kwargs"], "no robosuite kwargs")
    stack, token_path = _transforms(r, v)
    entries += stack
    if v["wrist"]:
        entries.append((("env", "kwargs", "wrist_camera"), "robot0_eye_in_hand",
                        o(("policy", "use_wrist_image"), ": true")))
    else:
        r.default(("policy", "use_wrist_image"), v["wrist"], "no wrist camera")
    group, candidate = v["group"], v["candidate"]
    same = "" if candidate else f": {flow(candidate)}, i.e. the group size"
    state_id = o(("env", "train_init_state_id")) if _get(config.data, ("env", "train_init_state_id"))[1] \
        else "env.train_init_state_id absent: the recipe reads 0"
    entries += [
        (("topology", "subcollectors"), v["subs"], o(("collector", "num_collectors"))),
        (("topology", "workers_per_subcollector"), v["per"], o(("collector", "envs_per_collector"))),
        (("topology", "start_method", "subcollectors"), "spawn", "the recipe's collector processes (torchrl: spawn)"),
        (("topology", "start_method", "workers"), "spawn", "the recipe's ParallelEnv(mp_start_method='spawn')"),
        (("assignment", "tasks"), task_text(v["task_ids"]), o(("env", "task_ids"), f": {v['task_ids']}")),
        (("assignment", "groups", "size"), group, o(("collector", "group_size"))),
        (("assignment", "groups", "candidate_size"), candidate or group,
         o(("collector", "candidate_group_size"), same)),
        (("assignment", "groups", "parallel_repeats"), v["parallel"], o(("env", "parallel_group_repeats"))),
        (("assignment", "init_states", "mode"), v["mode"], o(("env", "train_init_state_mode"))),
        (("assignment", "init_states", "id"), v["state_id"], state_id),
        (("assignment", "seeds", "base"), v["seed"], o(("env", "seed"), " (worker g: seed + g)")),
    ]
    render, warnings = _render(r, v["gl"], v["ids"], v["fallback"])
    entries += render + [
        (("collector", "sync"), False, "the recipe's Collector(sync=False)"),
        (("collector", "frames_per_batch"), v["per"], "Collector(frames_per_batch=envs_per_collector), async"),
    ]
    evaluation, differs = _eval(r, v)
    entries += evaluation
    differs += token_path
    left_out, unknown = _account(config, r.used)
    header = [f"Written by `topo import vla-grpo {name}` from torchrl's vla_grpo recipe config: each value names "
              "the key it came from. Its plan is the recipe's assignment, worker for worker "
              "(docs/reference/spec.md: \"The assignment\")."]
    footer = []
    if r.defaults:
        footer += ["Read from the config, and already topo's defaults (not written):"] + [f"  {d}" for d in r.defaults]
    if differs:
        footer += ["Where this spec differs from the recipe, on purpose:"] + [f"  {d}" for d in differs]
    if left_out:
        footer += ["Not expressed in a topo spec (the recipe's training loop: policy, inference server, replay, "
                   "logging):"] + [f"  {', '.join(keys)}: {why}" for why, keys in left_out]
    if unknown:
        footer += ["Unknown to this importer (not written):"] + [f"  {'.'.join(map(str, d.path))}" for d in unknown]
    return Imported(document(entries, header, footer), [config.locate(d) for d in warnings + unknown], left_out,
                    len(r.written), len(r.defaults), differs)


def _read(r: _Reader) -> dict[str, Any]:
    """Every key the recipe reads for its rollout envs, typed; raises :class:`SpecError` with all problems."""
    def flag(v: Any) -> bool:
        return isinstance(v, bool)

    v = {
        "backend": r.get(("env", "backend"), lambda x: isinstance(x, str), "a backend name"),
        "suite": r.get(("env", "task_suite"), lambda x: isinstance(x, str) and bool(x), "a LIBERO suite name"),
        "task_ids": r.get(("env", "task_ids"), _ints, "a non-empty list of task ids"),
        "parallel": r.get(("env", "parallel_group_repeats"), flag, "true or false"),
        "height": r.get(("env", "camera_height"), _positive, "a positive integer"),
        "width": r.get(("env", "camera_width"), _positive, "a positive integer"),
        "gl": r.get(("env", "render_backend"), lambda x: x is None or isinstance(x, str), "egl, osmesa or null"),
        "ids": r.get(("env", "render_gpu_ids"), lambda x: x is None or x == [] or _ints(x), "a list of ids or null"),
        "env_kwargs": r.get(("env", "env_kwargs"), lambda x: x is None or isinstance(x, dict), "a mapping or null"),
        "max_steps": r.get(("env", "max_env_steps"), _positive, "a positive integer"),
        "chunk": r.get(("env", "chunk_size"), _positive, "a positive integer"),
        "outer": r.get(("env", "max_outer_steps"), _positive, "a positive integer"),
        "mode": r.get(("env", "train_init_state_mode"), lambda x: x in INIT_STATE_MODES, " or ".join(INIT_STATE_MODES)),
        "state_id": r.get(("env", "train_init_state_id"), lambda x: _is_int(x) and x >= 0, "an init state id",
                          required=False, default=0),
        "seed": r.get(("env", "seed"), lambda x: _is_int(x) and x >= 0, "a non-negative integer"),
        "group": r.get(("collector", "group_size"), _positive, "a positive integer"),
        "candidate": r.get(("collector", "candidate_group_size"), lambda x: x is None or (_is_int(x) and x >= 0),
                           "an integer or null"),
        "subs": r.get(("collector", "num_collectors"), _positive, "a positive integer"),
        "per": r.get(("collector", "envs_per_collector"), _positive, "a positive integer"),
        "wrist": r.get(("policy", "use_wrist_image"), flag, "true or false"),
        "exp_name": r.get(("logger", "exp_name"), lambda x: x is None or isinstance(x, str), "a name", required=False),
    }
    if _get(r.config.data, ("policy", "backend"))[0] != "openvla":  # the env decodes its tokens (_transforms)
        v["vocab"] = r.get(("tokenizer", "vocab_size"), _positive, "a positive integer")
    v["fallback"] = r.get(("env", "render_gpu_device_zero_fallback"), flag, "true or false", required=bool(v["ids"]),
                          default=False)
    # the evaluation (the recipe's make_evaluator): optional, so that older configs still import
    v["eval_envs"] = r.get(("env", "eval_num_envs"), _positive, "a positive integer", required=False)
    v["eval_ids"] = r.get(("env", "eval_render_gpu_ids"), lambda x: x is None or x == [] or _ints(x),
                          "a list of ids or null", required=False)
    v["eval_episodes"] = r.get(("logger", "eval_episodes"), _positive, "a positive integer", required=False)
    v["eval_iter"] = r.get(("logger", "eval_iter"), lambda x: x is None or _is_int(x) and x >= 0,
                           "a number of iterations or null", required=False)
    v["eval_async"] = r.get(("logger", "eval_async"), flag, "true or false", required=False, default=False)
    v["eval_busy"] = r.get(("logger", "eval_busy_policy"), lambda x: x in BUSY_POLICIES, " or ".join(BUSY_POLICIES),
                           required=False, default="skip")
    if v["backend"] not in (None, "libero"):
        r.errors.append(error("import-backend", f"env.backend is {v['backend']!r}: this importer writes the recipe's "
                              "LIBERO topology", ("env", "backend"), "topo's toy backend builds ToyVLAEnv: start "
                              "from examples/toy_2x3.yaml"))
    if r.errors:
        raise SpecError([r.config.locate(d) for d in r.errors])
    return v


def _transforms(r: _Reader, v: dict[str, Any]) -> tuple[list, list[str]]:
    """The recipe's chunk-decision stack (utils.py ``_chunk_transform``) as ``env.transforms`` entries, one item a
    line, and what of it a spec cannot hold.

    The recipe's collector wraps each worker's env in it (``_make_collector_env``: a ParallelEnv of
    ``TransformedEnv`` workers), so the spec keeps ``transforms_at``'s default, ``worker``. Every policy but
    OpenVLA's emits tokens that the env decodes, with ``ActionTokenizerTransform`` after ``MultiAction``: the tiny
    policy's tokenizer is ``UniformActionTokenizer(tokenizer.vocab_size, low=-1.0, high=1.0)``
    (``make_action_tokenizer``), which :func:`topo.recipes.vla_grpo.action_tokens` builds from those values;
    OpenVLA's ``mode: tokens`` decodes with its checkpoint's codec and gripper post-process, objects its policy
    gives, no spec value: the spec leaves both out, and says so. ``mode: l1`` decodes in the policy. The policy
    keys are read here, not accounted for: the policy stays "not expressed".
    """
    o, path = r.origin, ("env", "transforms")
    backend, mode = _get(r.config.data, ("policy", "backend"))[0], _get(r.config.data, ("policy", "mode"))[0]
    chunk = o(("env", "chunk_size"), f": {v['chunk']} env steps per decision, the policy's chunk, which "
              "MultiAction unbinds; in each worker, as the recipe's collector wraps its envs")
    stack: list[tuple[Any, str]] = [({"MultiAction.from_vla" if (backend, mode) == ("openvla", "l1") else
                                      "MultiAction": {"stack_rewards": False}}, chunk)]
    differs = []
    if backend != "openvla":
        stack.append(({ACTION_TOKENS: {"vocab_size": v["vocab"], "low": -1.0, "high": 1.0}},
                      o(("tokenizer", "vocab_size"), f": the {backend} policy's ('vla_action', 'tokens') decoded to "
                        "its chunk; low, high: the recipe's UniformActionTokenizer bounds (no key)")))
    elif mode != "l1":
        differs.append(f"env.transforms: policy.mode is {mode!r}: the recipe decodes the policy's action tokens in "
                       "each env, with OpenVLA's GripperPostProcessTransform (openvla.py), then "
                       "ActionTokenizerTransform(tokenizer) after MultiAction; the tokenizer is the checkpoint's "
                       "codec, an object of the policy, not spec data, so the spec leaves both out: decode in the "
                       "policy, or add a package.module:callable building them")
    stack += [("SuccessReward", "the recipe's decision reward, its outer success flag (no key)"),
              ({"StepCounter": {"max_steps": v["outer"]}}, o(("env", "max_outer_steps"), ": decisions per episode"))]
    return [(path + (i,), item, comment) for i, (item, comment) in enumerate(stack)], differs


def _render(r: _Reader, gl: str | None, ids: list[int] | None, fallback: bool) -> tuple[list, list[Diagnostic]]:
    """The render_devices entries (EGL ids, as the recipe numbers them), or why there are none."""
    warnings = []
    if gl == "egl":
        r.default(("env", "render_backend"), gl, "topo's builder sets MUJOCO_GL=egl unless it is set")
    elif gl is None:
        r.default(("env", "render_backend"), gl, "MUJOCO_GL left to the environment; topo's builder: egl unless set")
    else:
        dropped = f"; render_gpu_ids {ids} and render_gpu_device_zero_fallback not written (only EGL uses them)"
        warnings.append(warning("import-render-backend", f"env.render_backend is {gl!r}: a spec does not choose the "
                                "GL backend" + (dropped if ids else ""), ("env", "render_backend"),
                                f"launch with MUJOCO_GL={gl}"))
        return [], warnings
    if not ids:
        r.default(("env", "render_gpu_ids"), ids, "no render device: workers render on the CPU")
        present, found = _get(r.config.data, ("env", "render_gpu_device_zero_fallback"))
        if found:
            r.default(("env", "render_gpu_device_zero_fallback"), present, "no render device to fall back from")
        return [], warnings
    entries = [
        (("assignment", "render_devices", "ids"), ids, r.origin(("env", "render_gpu_ids"),
                                                                f" (subcollector c: ids[c % {len(ids)}])")),
        (("assignment", "render_devices", "numbering"), "egl", "the recipe's ids are devices as EGL lists them"),
    ]
    if fallback:
        entries.append((("assignment", "render_devices", "device_zero_fallback"), True,
                        r.origin(("env", "render_gpu_device_zero_fallback"))))
    else:
        r.default(("env", "render_gpu_device_zero_fallback"), fallback, "no fallback, as topo's default")
    return entries, warnings


def _eval(r: _Reader, v: dict[str, Any]) -> tuple[list, list[str]]:
    """The eval section: the recipe's evaluator (make_evaluator, _make_eval_env) as topo plans it, and what differs.

    The recipe builds ``eval_num_envs`` workers, worker w on ``task_ids[w % T]`` with init states cycled from
    0, and counts ``eval_episodes`` episodes: ``eval_episodes / T`` init states of each task, 0 first. Its
    worker w renders on ``ids[w % len(ids)]`` (``eval_render_gpu_ids``, or ``render_gpu_ids`` when null): topo
    renders per subcollector, so each id gets one eval subcollector with the workers the recipe gives it.
    """
    o, entries, differs = r.origin, [], []
    tasks = v["task_ids"]
    n = len(tasks)
    entries.append((("eval", "tasks"), task_text(tasks), o(("env", "task_ids"), ": the recipe evaluates its "
                                                            "training tasks (topo warns: eval-on-train-tasks)")))
    differs.append("eval.tasks: the recipe evaluates on its training tasks (env.task_ids); kept, and topo warns "
                   "(eval-on-train-tasks): held-out tasks, ones assignment.tasks leaves out, are the alternative")
    if v["eval_episodes"] is not None:
        per = -(-v["eval_episodes"] // n)
        note = f" / {n} tasks" + ("" if v["eval_episodes"] % n == 0 else
                                  f", rounded up: {per * n} episodes, every task alike")
        entries.append((("eval", "init_states"), f"0-{per - 1}" if per > 1 else 0,
                        o(("logger", "eval_episodes"), f": {v['eval_episodes']}{note} (init states cycled from 0)")))
    if v["eval_envs"] is not None:
        entries += _eval_workers(r, v)
    # the recipe's eval seed is env.seed + 1: ParallelEnv.set_seed chains seeds from training worker 1's
    workers = v["subs"] * v["per"]
    entries.append((("eval", "seeds", "base"), v["seed"] + workers,
                    f"env.seed + {workers} training workers (the recipe: env.seed + 1, training worker 1's seed)"))
    differs.append(f"eval.seeds.base: {v['seed'] + workers}, after the {workers} training seeds "
                   f"{v['seed']}-{v['seed'] + workers - 1}: the recipe seeds its evaluation with env.seed + 1 = "
                   f"{v['seed'] + 1}, the seed of training worker 1 (topo refuses that overlap: "
                   "eval-seed-overlaps-train)")
    if v["eval_iter"]:
        entries.append((("eval", "every"), v["eval_iter"], o(("logger", "eval_iter"))))
    elif _get(r.config.data, ("logger", "eval_iter"))[1]:
        r.default(("logger", "eval_iter"), v["eval_iter"], "no periodic evaluation: run.evaluate() only")
    for key, name, value, default in (("eval_async", "async", v["eval_async"], False),
                                      ("eval_busy_policy", "busy_policy", v["eval_busy"], "skip")):
        if not _get(r.config.data, ("logger", key))[1]:
            continue
        if value == default:
            r.default(("logger", key), value, f"eval.{name}'s default")
        else:
            entries.append((("eval", name), value, o(("logger", key))))
    return entries, differs


def _eval_workers(r: _Reader, v: dict[str, Any]) -> list:
    """eval.workers and its render devices: one eval subcollector per render id, with the recipe's workers on it."""
    o, count = r.origin, v["eval_envs"]
    ids = v["eval_ids"] if v["eval_ids"] else None
    key = ("env", "eval_render_gpu_ids")
    if ids is None and v["gl"] in (None, "egl") and v["ids"]:
        ids, origin = v["ids"], (o(key, ": null, so env.render_gpu_ids") if _get(r.config.data, key)[1]
                                 else "env.render_gpu_ids (no env.eval_render_gpu_ids)")
    elif ids is not None and v["gl"] in (None, "egl"):
        origin = o(key)
    else:
        if _get(r.config.data, key)[1]:
            r.default(key, v["eval_ids"], "no render device: eval workers render on the CPU")
        return [(("eval", "workers"), count, o(("env", "eval_num_envs")))]
    used = ids[:count]
    sizes = [count // len(ids) + (1 if i < count % len(ids) else 0) for i in range(len(used))]
    if len(used) == 1:
        entries = [(("eval", "workers"), count, o(("env", "eval_num_envs")))]
    else:
        entries = [(("eval", "workers", "subcollectors"), len(used), f"one per eval render id ({len(used)})"),
                   (("eval", "workers", "workers_per_subcollector"), sizes[0] if len(set(sizes)) == 1 else sizes,
                    o(("env", "eval_num_envs"), f": {count}, worker w renders on ids[w % {len(ids)}]"))]
    entries += [(("eval", "render_devices", "ids"), used, origin + (" (one eval subcollector each)" if len(used) > 1
                                                                    else "")),
                (("eval", "render_devices", "numbering"), "egl", "the recipe's ids are devices as EGL lists them")]
    if v["fallback"]:
        entries.append((("eval", "render_devices", "device_zero_fallback"), True,
                        "env.render_gpu_device_zero_fallback (eval workers too)"))
    return entries


def task_text(ids: list[int]) -> Any:
    """topo's task list for the recipe's, order kept: ascending runs of 3 or more as ranges, a single run as
    one range string ('0-9'), one id as itself."""
    if len(ids) == 1:
        return ids[0]
    runs: list[list[int]] = []
    for t in ids:
        if runs and t == runs[-1][-1] + 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    items: list[Any] = []
    for run in runs:
        if len(run) >= 3:
            items.append(f"{run[0]}-{run[-1]}")
        else:
            items.extend(run)
    return items[0] if len(items) == 1 else items


def _account(config: Config, used: set) -> tuple[list[tuple[str, list[str]]], list[Diagnostic]]:
    """Every key not written: what it is for (grouped by reason, in config order), and the unknown ones."""
    reasons: dict[str, list[str]] = {}
    unknown: list[Diagnostic] = []
    for section, body in config.data.items():
        if section in ("env", "collector") and isinstance(body, dict):
            for key in body:
                path = (section, key)
                if path in used:
                    continue
                if path in LEFT_OUT:
                    reasons.setdefault(LEFT_OUT[path], []).append(f"{section}.{key}")
                else:
                    known = [k for s, k in list(LEFT_OUT) + list(used) if s == section]
                    close = difflib.get_close_matches(str(key), known, n=1)
                    unknown.append(warning("import-unknown-key", f"{section}.{key} is not a key of the vla_grpo "
                                           "recipe this importer knows: not written", path,
                                           f"did you mean {section}.{close[0]}?" if close else
                                           "if the recipe reads it now, write it into the spec by hand"))
        elif section in SECTIONS:
            keys = [k for k in (body if isinstance(body, dict) else {}) if (section, k) not in used]
            for k in keys:
                if (section, k) in LEFT_OUT:
                    reasons.setdefault(LEFT_OUT[(section, k)], []).append(f"{section}.{k}")
            keys = [f"{section}.{k}" for k in keys if (section, k) not in LEFT_OUT]
            if keys or not isinstance(body, dict):
                reasons.setdefault(SECTIONS[section], []).extend(keys or [section])
        else:
            unknown.append(warning("import-unknown-key", f"section {section!r} is not one of the vla_grpo recipe's",
                                   (section,), "sections: env, collector, " + ", ".join(SECTIONS)))
    return list(reasons.items()), unknown
