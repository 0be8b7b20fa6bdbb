"""``topo replay RUN EPISODE``: one recorded episode, rebuilt in this process from its plan row and replayed.

The env is built as its worker built it (the row's builder and kwargs, with the seed of that worker
life: :func:`topo.launch.supervision.lives.restart_rows`), given the seed state recorded at the episode's reset
(:func:`topo.envs.recording.restore_seed_state`; an eval episode is set up by its schedule, as its eval
worker did), reset, and stepped with the recorded actions. Each step's digest is compared with the
recorded one: on the CPU with the same versions a faithful replay is bit-identical, and where it is not,
the first step that differs is named (with the rewards when they differ). It needs the run to have
recorded actions (``launch.record_actions: true``). Frames, when the env returns images, go to a PNG
strip or an animated GIF.
"""
from __future__ import annotations

import binascii
import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topo.runtime.episodes import Episode, Episodes, blob_bytes, find_run, joined
from topo.errors import RecordError, StalePlanError, UsageError
from topo.launch.supervision.lives import restart_rows
from topo.compiler.planfile import check_compatible
from topo.runtime.builder import import_builder

FRAME_KEYS = ("pixels", ("observation", "image"))
STRIP_FRAMES = 16  # frames in a PNG strip, evenly spaced over the episode


@dataclass
class Replay:
    """What a replay found: ``identical`` when every step's digest matches the recording."""

    episode: str
    run_dir: str
    row: dict[str, Any]
    steps: int
    recorded_steps: int
    first_difference: dict[str, Any] | None
    seconds: float
    recorded_return: float | None
    replayed_return: float
    complete: bool = True  # False: the episode had not ended when its worker stopped (the recording stops there)
    video: str | None = None
    frames: list = field(default_factory=list, repr=False)
    notes: list[str] = field(default_factory=list)  # what the recording lacked (a seed-state part left out)

    @property
    def identical(self) -> bool:
        return self.first_difference is None and self.steps == self.recorded_steps

    def to_dict(self) -> dict[str, Any]:
        return {"episode": self.episode, "run_dir": self.run_dir, "identical": self.identical, "steps": self.steps,
                "recorded_steps": self.recorded_steps, "first_difference": self.first_difference,
                "recorded_return": self.recorded_return, "replayed_return": self.replayed_return,
                "seconds": round(self.seconds, 3), "video": self.video, "complete": self.complete, "notes": self.notes,
                "row": {k: v for k, v in self.row.items() if k != "kwargs"}}

    def __str__(self) -> str:
        task = self.row.get("task_id")
        where = f"subcollector {self.row.get('subcollector')}, worker {self.row.get('index')}" + (
            f", task {task}" if task is not None else "")
        head = f"episode {self.episode} ({where}): {self.steps} steps replayed in {self.seconds:.1f}s"
        cut = "" if self.complete else " (the recording stops there: its worker stopped mid-episode)"
        notes = "".join(f"\nnote: {note}" for note in self.notes)
        if self.identical:
            return f"{head}; every step identical to the recording{cut} (return {self.replayed_return:g}){notes}"
        diff = self.first_difference
        if diff is None:
            return f"{head}; the recording has {self.recorded_steps} steps{notes}"
        return f"{head}; first difference at {diff['what']}: {diff['detail']}{notes}"


def replay(run: str, episode: str | int, *, actions: dict[str, np.ndarray] | None = None, video: str | None = None,
           actions_from: str | None = None) -> Replay:
    """Replay ``episode`` of the run directory ``run`` (or of the latest run in a report directory).

    ``actions`` replace the recorded ones (``{action key: [T, ...]}``; ``actions_from``: the file they came from,
    named when they do not fit); ``video`` (a ``.png`` or ``.gif`` path) receives the frames. Raises
    :class:`~topo.errors.UsageError` for an unknown episode, a run that recorded no actions, actions the env
    does not take, or a video of an env without images; :class:`~topo.errors.RecordError` for a record that
    is not as its run wrote it (the file and line named), before any env is built.
    """
    from topo.envs.recording import EpisodeLog, decode_seed_state, restore_seed_state

    run_dir = _run_dir(run)
    episodes = Episodes(run_dir)
    try:
        found = episodes.get(episode)
    except (KeyError, ValueError) as err:
        raise UsageError(str(err).strip("'\"")) from None
    try:
        recorded = episodes.steps(found.id)
    except LookupError as err:
        raise UsageError(f"episode {found.id} cannot be replayed: {str(err).split(': ', 1)[1]}") from None
    if actions is None:
        actions = {k[len("action."):]: v for k, v in recorded.items() if k.startswith("action.")}
    started = time.monotonic()
    parts = None if found.id.eval else _seed_parts(found, episodes)
    try:
        seed_state = None if parts is None else decode_seed_state(parts)
    except ValueError as err:
        raise RecordError(_life_path(found), f"episode {found.id}: {err}", hint=FOREIGN_HINT) from None
    base, env = _build(found, episodes)
    notes = [f"its {name} state was not recorded ({why}): the replay starts without it"
             for name, why in (found.start.get("unrecorded") or {}).items()]
    memory = _Memory()
    log = EpisodeLog(memory, row=found.id.row, restart=found.id.restart, seed=found.start.get("seed"),
                     eval=found.id.eval, actions=True)
    from torchrl.envs.utils import step_mdp

    wrapped = log.install(env, None if base is env else base)
    try:
        _check_actions(actions, wrapped, actions_from)
        if seed_state is not None:
            try:
                restore_seed_state(base, seed_state)
            except (TypeError, ValueError, RuntimeError, KeyError, IndexError, OverflowError) as err:
                raise RecordError(_life_path(found), f"episode {found.id}: its seed state does not fit this env: "
                                  f"{err}", hint=FOREIGN_HINT) from None
        td = wrapped.reset()
        frames = [_frame(td)]
        steps = len(next(iter(actions.values()))) if actions else 0
        for t in range(steps):
            for name, values in actions.items():
                td.set(tuple(name.split(".")) if "." in name else name, _tensor(values[t], td, name, wrapped))
            td = wrapped.step(td)
            frames.append(_frame(td["next"]))
            if bool(td["next", "done"].any()):
                steps = t + 1
                break
            td = step_mdp(td)
        log.finish("replayed")
    finally:
        wrapped.close()
    replayed = joined(memory.chunks)
    diff = _first_difference(recorded, replayed)
    result = Replay(str(found.id), run_dir, found.row, steps, len(recorded["digests"]) - 1, diff,
                    time.monotonic() - started, (found.end or {}).get("return"), float(replayed["rewards"].sum()),
                    complete=found.end is not None, notes=notes)
    if video:
        result.video = _write_video(video, [f for f in frames if f is not None])
    return result


FOREIGN_HINT = "a run directory is replayed by the topo that recorded it, from its own files; record the run again"


def _run_dir(run: str) -> str:
    try:
        return find_run(run)
    except FileNotFoundError as err:
        raise UsageError(str(err)) from None


def _life_path(found: Episode) -> str:
    return os.path.join(found.folder, found.id.life + ".jsonl")


def _seed_parts(found: Episode, episodes: Episodes) -> dict[str, bytes]:
    """The blobs of the seed state recorded at the episode's reset, each checked against its digest."""
    parts = {}
    for name, ref in found.start["state"].items():
        text = episodes.blobs.get(ref)
        try:
            blob = None if text is None else blob_bytes(text)
        except (binascii.Error, ValueError):
            blob = None
        if blob is None:
            raise RecordError(_life_path(found), f"episode {found.id}: its {name} state refers to blob {ref}, which "
                              "no record of its run holds as base64 (of a zlib stream)", hint=FOREIGN_HINT)
        if hashlib.blake2b(blob, digest_size=16).hexdigest() != ref:
            raise RecordError(_life_path(found), f"episode {found.id}: its {name} state's blob does not match its "
                              f"digest {ref}: it was changed after it was recorded", hint=FOREIGN_HINT)
        parts[name] = blob
    return parts


def _build(found: Episode, episodes: Episodes):
    """(the env the episode's worker built (an eval episode's: its schedule sets it up), with the seed of its
    worker life; the env it stepped: under its row's ``transforms``, that stack over it); a record whose seed is
    not that life's is of another run. (A stack over the subcollector's ``ParallelEnv`` is not the worker's: its
    episodes are recorded, and replayed, step by env step.)"""
    row = found.row
    if not row:
        raise UsageError(f"the plan in {episodes.run_dir} has no row for episode {found.id}")
    try:
        check_compatible(episodes.plan)
    except StalePlanError as err:
        raise RecordError(os.path.join(episodes.run_dir, "launch.json"), f"{err} (a run directory of another topo)",
                          hint="replay it with the topo that recorded it") from None
    transforms = (row.get("kwargs") or {}).get("transforms")
    env = _eval_env(row, found) if found.id.eval else _train_env(found, episodes, row)
    if not transforms:
        return env, env
    from topo.runtime.transforms import wrap

    return env, wrap(env, transforms)


def _train_env(found: Episode, episodes: Episodes, row: dict):
    try:
        kwargs = restart_rows(episodes.plan, row["subcollector"], found.id.restart)[row["index"]]["kwargs"]
        builder, env_kwargs = kwargs["builder"], dict(kwargs["env"])
    except (KeyError, TypeError, IndexError, ValueError) as err:
        raise RecordError(os.path.join(episodes.run_dir, "launch.json"), f"its plan has no usable row for episode "
                          f"{found.id} ({type(err).__name__}: {err})", hint=FOREIGN_HINT) from None
    if found.start.get("seed") != kwargs.get("seed"):
        raise RecordError(_life_path(found), f"episode {found.id} was recorded with seed {found.start.get('seed')}, "
                          f"but its worker life in this run's plan has seed {kwargs.get('seed')}: a record of another "
                          "run", hint=FOREIGN_HINT)
    render = {key: kwargs.get(key) for key in ("render_gpu", "render_numbering", "render_fallback")}
    env = import_builder(builder)(env_kwargs, **render)
    if kwargs.get("seed") is not None:
        env.set_seed(kwargs["seed"])
    return env


def _eval_env(row: dict, found: Episode):
    """A scheduled env running only this eval episode, in the round it ran in."""
    if found.planned is None:
        raise UsageError(f"eval episode {found.id} names plan episode {found.start.get('eval_episode')}, which its "
                         "row does not schedule")
    from topo.envs.scheduled import ScheduledEnv

    kwargs = row["kwargs"]
    render = {key: kwargs.get(key) for key in ("render_gpu", "render_numbering", "render_fallback")}
    schedule = dict(kwargs["schedule"], episodes=[found.planned])
    rnd = int(found.start.get("eval_round") or 1)
    return ScheduledEnv(schedule, lambda env: import_builder(kwargs["builder"])(dict(env), **render), lambda: rnd)


class _Memory:
    """An :class:`~topo.envs.recording.EpisodeLog` writer keeping the replayed steps here (a replay compares
    steps: its start and end records are not kept)."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def blobs(self, parts):
        return {}, {}, {}

    def write(self, record: dict) -> None:
        pass

    def append_steps(self, blob: bytes) -> tuple[int, int]:
        self.chunks.append(blob)
        return 0, len(blob)


def _first_difference(recorded: dict[str, np.ndarray], replayed: dict[str, np.ndarray]) -> dict[str, Any] | None:
    want, got = recorded["digests"], replayed["digests"]
    for t in range(min(len(want), len(got))):
        if want[t] == got[t]:
            continue
        what = "the reset" if t == 0 else f"step {t}"
        detail = "its observation differs from the recording"
        if t > 0 and "rewards" in recorded and t - 1 < len(recorded["rewards"]):
            a, b = float(recorded["rewards"][t - 1]), float(replayed["rewards"][t - 1])
            if a != b:
                detail = f"reward {b:g} replayed, {a:g} recorded"
        return {"step": t, "what": what, "detail": detail}
    if len(want) != len(got):
        t = min(len(want), len(got))
        return {"step": t, "what": f"step {t}", "detail": f"the replay ended after {len(got) - 1} steps, the recording "
                                                          f"after {len(want) - 1}"}
    return None


def _check_actions(actions: dict[str, np.ndarray], env, source: str | None) -> None:
    """Actions this env takes: one array per action key of its spec, each with a step axis, all as long."""
    where = f"{source}: " if source else ""
    keys = {".".join(k) if isinstance(k, tuple) else k for k in env.full_action_spec.keys(True, True)}
    unknown = sorted(set(actions) - keys)
    if unknown:
        raise UsageError(f"{where}the actions name {', '.join(map(repr, unknown))}, which this env does not take (its action "
                         f"keys: {', '.join(sorted(keys))})")
    lengths = {name: (len(v) if v.ndim else None) for name, v in actions.items()}
    if None in lengths.values() or len(set(lengths.values())) > 1:
        raise UsageError(f"{where}the actions need one array per action key, each [steps, ...], all as long: got lengths "
                         f"{lengths}")
    for name, values in actions.items():
        shape = tuple(env.full_action_spec[tuple(name.split(".")) if "." in name else name].shape)
        if len(values.shape[1:]) != len(shape) or any(d not in (-1, v) for d, v in zip(shape, values.shape[1:])):
            raise UsageError(f"{where}the actions {name!r} have shape {tuple(values.shape)}: each step's must be {shape}")


def _tensor(value: np.ndarray, td, name: str, env):
    import torch

    spec = env.full_action_spec[tuple(name.split(".")) if "." in name else name]
    return torch.as_tensor(value, dtype=spec.dtype, device=td.device)


def _frame(td) -> np.ndarray | None:
    for key in FRAME_KEYS:
        value = td.get(key, None)
        if value is not None and value.dtype.is_floating_point is False and value.ndim >= 3:
            array = value.detach().cpu().numpy()
            return array if array.shape[-1] in (1, 3, 4) else np.moveaxis(array, -3, -1)
    return None


def _write_video(path: str, frames: list[np.ndarray]) -> str:
    """A PNG strip (``.png``, up to :data:`STRIP_FRAMES` frames) or an animated GIF (``.gif``, every frame)."""
    if not frames:
        raise UsageError("this env returns no image (pixels or observation.image): nothing to write to " + path)
    from PIL import Image

    images = [Image.fromarray(np.ascontiguousarray(f.squeeze()).astype(np.uint8)) for f in frames]
    if path.endswith(".gif"):
        images[0].save(path, save_all=True, append_images=images[1:], duration=100, loop=0)
        return path
    chosen = [images[round(i * (len(images) - 1) / max(1, STRIP_FRAMES - 1))] for i in range(min(STRIP_FRAMES, len(images)))]
    strip = Image.new("RGB", (sum(i.width for i in chosen), max(i.height for i in chosen)))
    x = 0
    for image in chosen:
        strip.paste(image.convert("RGB"), (x, 0))
        x += image.width
    strip.save(path)
    return path
