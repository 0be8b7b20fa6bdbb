"""Episode provenance: the id every collected step carries, the records behind it, and their reading.

Every step an env worker returns carries ``topo_episode``, an int64 that says which episode it belongs
to: the worker's plan row (its ``global_index``), the worker's life (the subcollector's restart number:
a restart or a recycle starts a new life) and the episode's ordinal in that life. As text it is
``w5-r0-e12`` (training) or ``eval-w1-r0-e3`` (an eval row's). The ids are unique in a run.

The worker writes what the id resolves to into the run directory (:mod:`topo.envs.recording`), one
JSON line per event in ``episodes/<life>.jsonl`` (``<life>``: ``w5.r0``, ``eval-w1.r0``):

- ``start``: the id, when, the seed the worker was given, the init state and group id the env reports,
  and the seed state at the reset: the global RNGs (torch, numpy, random) and the env's own state, each
  plain data (:mod:`topo.envs.seed_codec`, never a pickle) stored once as a blob (base64, of its zlib stream
  where that is shorter: :func:`blob_bytes`) and referred to by its digest when it recurs (``blobs``; a part that is no plain data is left out and named in ``unrecorded``);
- ``end``: steps, return, success, how it ended, and with ``launch.record_actions`` where its actions
  and per-step observation digests lie in ``<life>.steps`` (offset, length: an ``.npz``).

Each subcollector writes, per batch, which policy versions acted in which episode
(``episodes/versions.sub<c>.r<k>.jsonl``). :class:`Episodes` joins them with the plan rows: what
``topo runs show`` lists and :func:`topo.runtime.episodes` returns. Pure: imports neither torch nor numpy.

A run directory travels (``here is the failing episode``), so its records are read as data within bounds
(:data:`~topo.compiler.limits.MAX_RECORD_BYTES` a line, :data:`~topo.compiler.limits.MAX_STEPS_BYTES` a chunk of steps): a
record of the wrong shape, of another worker life, or past a bound is a :class:`~topo.errors.RecordError`
naming the file and line; only a last line cut short (a worker killed mid-write) is skipped.
"""
from __future__ import annotations

import base64
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from topo.errors import RecordError
from topo.compiler.limits import MAX_PLAN_BYTES, MAX_RECORD_BYTES, MAX_STEPS_BYTES, count

KEY = "topo_episode"  # the batch key
FOLDER = "episodes"
RECORD_VAR = "TOPO_RECORD"  # in a run's processes: "episodes" (the default), "actions" (record_actions) or "off"
RETAIN_VAR = "TOPO_RETAIN_EPISODES"  # in a run's processes: launch.retain_episodes ("": every episode is kept)
EVAL_BIT = 1 << 62
ROW_SHIFT, ROW_BITS = 42, 20  # a plan row's global_index: up to 1,048,575
LIFE_SHIFT, LIFE_BITS = 28, 14  # a restart number: up to 16,383
EPISODE_BITS = 28  # episodes in one worker life: up to 268,435,455
_TEXT = re.compile(r"^(eval-)?w(\d+)-r(\d+)-e(\d+)$")


@dataclass(frozen=True)
class EpisodeId:
    """An episode's identity: plan row ``row`` (an eval row's when ``eval``), life ``restart``, ordinal ``episode``."""

    row: int
    restart: int
    episode: int
    eval: bool = False

    def __post_init__(self) -> None:
        for name, bits in (("row", ROW_BITS), ("restart", LIFE_BITS), ("episode", EPISODE_BITS)):
            value = getattr(self, name)
            if not 0 <= value < 1 << bits:
                raise ValueError(f"an episode id's {name} must lie in [0, {1 << bits}), got {value}")

    def __int__(self) -> int:
        return (EVAL_BIT if self.eval else 0) | self.row << ROW_SHIFT | self.restart << LIFE_SHIFT | self.episode

    def __str__(self) -> str:
        return f"{'eval-' if self.eval else ''}w{self.row}-r{self.restart}-e{self.episode}"

    @property
    def life(self) -> str:
        """The file stem of the worker life it belongs to: ``w5.r0``."""
        return f"{'eval-' if self.eval else ''}w{self.row}.r{self.restart}"

    @classmethod
    def of(cls, value: int | str | EpisodeId) -> EpisodeId:
        """From the batch's int64, its text (``w5-r0-e12``) or an id."""
        if isinstance(value, EpisodeId):
            return value
        if isinstance(value, str):
            found = _TEXT.match(value.strip())
            if found is None:
                if value.strip().lstrip("-").isdigit():
                    return cls.of(int(value))
                raise ValueError(f"not an episode id: {value!r} (ids read like w5-r0-e12 or eval-w1-r0-e3)")
            return cls(int(found[2]), int(found[3]), int(found[4]), eval=bool(found[1]))
        value = int(value)
        if value < 0:
            raise ValueError(f"not an episode id: {value} (an eval worker's idle step has none)")
        mask = lambda bits: (1 << bits) - 1  # noqa: E731
        return cls((value >> ROW_SHIFT) & mask(ROW_BITS), (value >> LIFE_SHIFT) & mask(LIFE_BITS),
                   value & mask(EPISODE_BITS), eval=bool(value & EVAL_BIT))


def episode_id(value: int | str) -> str:
    """The text of an episode id (``batch["topo_episode"]``'s int64 or text): ``w5-r0-e12``."""
    return str(EpisodeId.of(value))


def counts(run_dir: str) -> dict[str, Any]:
    """What a run directory holds, without parsing it (the report's ``episodes`` section): episodes started,
    worker lives, whether actions were kept, and the folder."""
    folder = os.path.join(run_dir, FOLDER)
    names = os.listdir(folder) if os.path.isdir(folder) else []
    lives = [n for n in names if n.endswith(".jsonl") and not n.startswith("versions.")]
    started = 0
    for name in lives:
        with open(os.path.join(folder, name), "rb") as f:
            started += sum(chunk.count(b'{"event": "start"') for chunk in iter(lambda: f.read(1 << 20), b""))
    return {"recorded": started, "worker_lives": len(lives), "actions": any(n.endswith(".steps") for n in names),
            "folder": folder}


def life_file(run_dir: str, life: str, suffix: str = ".jsonl") -> str:
    return os.path.join(run_dir, FOLDER, life + suffix)


def versions_file(run_dir: str, subcollector: int, restart: int) -> str:
    return os.path.join(run_dir, FOLDER, f"versions.sub{subcollector}.r{restart}.jsonl")


@dataclass
class Episode:
    """One episode as the run recorded it, with its plan row."""

    id: EpisodeId
    row: dict[str, Any]  # the plan row (training) or eval row it ran from; {} when the plan does not have it
    start: dict[str, Any]  # the worker's start record
    end: dict[str, Any] | None = None  # None: it had not ended when the worker stopped
    versions: dict[int | None, int] = field(default_factory=dict)  # policy version -> steps it acted (None: none)
    folder: str = ""  # the episodes folder holding its records (a training run's eval episodes: its eval run's)
    chunks: list = field(default_factory=list)  # (offset, length) of its recorded steps in the life's .steps file

    @property
    def planned(self) -> dict[str, Any] | None:
        """An eval episode's entry in its row's schedule (task, init state, trial, seed); None for training."""
        number = self.start.get("eval_episode")  # the plan's episode number, as the eval worker stamps it
        if not self.id.eval or number is None:
            return None
        return next((e for e in self.row.get("episodes") or [] if e.get("episode") == number), None)

    def summary(self) -> dict[str, Any]:
        """JSON: what ``topo runs show`` lists."""
        row, end = self.row, self.end or {}
        planned = self.planned or {}
        return {"id": str(self.id), "eval": self.id.eval, "subcollector": row.get("subcollector"),
                "worker": row.get("index"), "global_index": self.id.row, "restart": self.id.restart,
                "episode": self.id.episode, "task_id": planned.get("task_id", row.get("task_id")),
                "instruction": self.start.get("instruction", row.get("instruction")),
                "group": row.get("group"), "group_id": self.start.get("group_id"),
                "init_state": self.start.get("init_state"), "seed": planned.get("seed", self.start.get("seed")),
                "eval_round": self.start.get("eval_round"), "eval_episode": self.start.get("eval_episode"),
                "started": self.start.get("time"), "return": end.get("return"), "success": end.get("success"),
                # no end record: it runs, or its worker stopped mid-episode; its steps so far, from the batches
                "steps": end["steps"] if self.end else sum(self.versions.values()) or None,
                **({"env_steps": end["env_steps"]} if "env_steps" in end else {}),  # under a stack: steps are decisions
                "ended": end["how"] if self.end else "open",
                "policy_versions": sorted((v for v in self.versions if v is not None)),
                "recorded_actions": bool(self.chunks)}


class Episodes:
    """The episodes of a run, read once when made: ``run`` is its run directory (``topo-run-*``) or the report
    directory holding it (:func:`find_run`); a training run's evaluations (its eval run, under
    ``eval/collector/``) are read with it. Iterate it, :meth:`get` one by id, :meth:`select` by filters."""

    def __init__(self, run: str | os.PathLike[str]):
        self.run_dir = find_run(os.fspath(run))
        self.plan = _plan(self.run_dir)
        self.blobs: dict[str, str] = {}
        self._rows: dict[tuple[bool, int], dict[str, Any]] | None = None
        self._episodes: dict[EpisodeId, Episode] = {}
        for folder in record_folders(self.run_dir):
            lives, versions = record_files(folder)
            for path in lives:
                self._read_life(path)
            for path in versions:
                self._read_versions(path)

    def __iter__(self) -> Iterator[Episode]:
        return iter(sorted(self._episodes.values(), key=lambda e: (e.id.eval, e.start.get("time") or 0.0, int(e.id))))

    def __len__(self) -> int:
        return len(self._episodes)

    def get(self, value: int | str | EpisodeId) -> Episode:
        """The episode of an id; KeyError naming the run directory when it has none."""
        key = EpisodeId.of(value)
        if key not in self._episodes:
            raise KeyError(f"run {self.run_dir} recorded no episode {key}")
        return self._episodes[key]

    def steps(self, value: int | str | EpisodeId) -> dict[str, Any]:
        """An episode's recorded steps (``launch.record_actions``): numpy arrays ``action.<key>`` ``[T, ...]``,
        ``rewards`` ``[T]`` and ``digests`` ``[T + 1]`` (the reset's, then each step's). An episode cut short (its
        worker killed) has the steps written before. ``LookupError`` saying why when there are none. Imports numpy."""
        episode = self.get(value)
        if not episode.chunks:
            raise LookupError(f"episode {episode.id} has no recorded steps: the run recorded no actions: set "
                              "launch.record_actions: true in the spec")
        blobs = []
        path = os.path.join(episode.folder, episode.id.life + ".steps")
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                for offset, length in episode.chunks:
                    if offset + length > size:
                        raise RecordError(path, f"episode {episode.id}'s steps at bytes {offset:,}-{offset + length:,} "
                                          f"lie past the file's end ({size:,} bytes)", hint=RECORD_HINT)
                    f.seek(offset)
                    blobs.append(f.read(length))
        except OSError as err:
            raise RecordError(path, f"episode {episode.id}'s recorded steps cannot be read: {err.strerror}") from None
        return joined(blobs, path)

    def select(self, *, task: int | None = None, worker: int | None = None, subcollector: int | None = None,
               version: int | None = None, min_return: float | None = None, max_return: float | None = None,
               success: bool | None = None, eval: bool | None = None) -> list[Episode]:
        """The episodes matching every filter given (``worker``: a plan row's global index)."""
        out = []
        for e in self:
            s = e.summary()
            ret = s["return"]
            if ((task is not None and s["task_id"] != task) or (worker is not None and e.id.row != worker)
                    or (subcollector is not None and s["subcollector"] != subcollector)
                    or (version is not None and version not in e.versions)
                    or (min_return is not None and (ret is None or ret < min_return))
                    or (max_return is not None and (ret is None or ret > max_return))
                    or (success is not None and s["success"] is not success)
                    or (eval is not None and e.id.eval is not eval)):
                continue
            out.append(e)
        return out

    def _read_life(self, path: str) -> None:
        life = os.path.basename(path)[:-len(".jsonl")]
        for line, record in _lines(path):
            problem = _life_problem(record, life)
            if problem:
                raise RecordError(path, problem, line=line, hint=RECORD_HINT)
            self.blobs.update(record.get("blobs") or {})
            key = EpisodeId.of(record["id"])
            event = record.get("event")
            if event == "start":
                self._episodes[key] = Episode(key, self._row(key), record, folder=os.path.dirname(path))
            elif key in self._episodes and event == "steps":
                self._episodes[key].chunks.append(record["at"])
            elif key in self._episodes:
                self._episodes[key].end = record

    def _read_versions(self, path: str) -> None:
        for line, record in _lines(path):
            pairs = version_pairs(record, path, line)
            for value, version, steps in pairs:
                try:
                    episode = self._episodes.get(EpisodeId.of(value))
                except ValueError:
                    continue  # an eval worker's idle steps
                if episode is not None:
                    episode.versions[version] = episode.versions.get(version, 0) + steps

    def _row(self, key: EpisodeId) -> dict[str, Any]:
        if self._rows is None:
            self._rows = plan_rows(self.plan, self.run_dir)
        return self._rows.get((key.eval, key.row), {})


def record_folders(run_dir: str) -> list[str]:
    """The episodes folders of a run: its own, then its eval run's (``eval/collector/topo-run-*``), in order."""
    evaluations = os.path.join(run_dir, "eval", "collector")
    return [os.path.join(run_dir, FOLDER)] + sorted(
        os.path.join(evaluations, name, FOLDER) for name in (os.listdir(evaluations) if os.path.isdir(evaluations)
                                                             else []) if name.startswith("topo-run-"))


def record_files(folder: str) -> tuple[list[str], list[str]]:
    """(worker lives' records, policy versions' records) of an episodes folder, each sorted by name."""
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return ([os.path.join(folder, n) for n in names if n.endswith(".jsonl") and not n.startswith("versions.")],
            [os.path.join(folder, n) for n in names if n.startswith("versions.") and n.endswith(".jsonl")])


def plan_rows(plan: dict[str, Any] | None, run_dir: str) -> dict[tuple[bool, int], dict[str, Any]]:
    """``(eval, global_index) -> row`` of a plan (the first row of an index): an eval run's own plan has its eval rows
    as subcollectors, a training plan has them under ``eval``."""
    if plan is None:
        return {}
    out: dict[tuple[bool, int], dict[str, Any]] = {}
    try:
        for is_eval in (False, True):
            subs = plan["eval"]["subcollectors"] if is_eval and plan.get("eval") else plan["subcollectors"]
            for row in (row for sub in subs for row in sub["workers"]):
                out.setdefault((is_eval, row.get("global_index")), row)
    except (KeyError, TypeError, AttributeError) as err:
        raise RecordError(os.path.join(run_dir, "launch.json"), f"its plan is not a topo plan "
                          f"({type(err).__name__}: {err})", hint=RECORD_HINT) from None
    return out


def version_pairs(record: Any, path: str, line: int) -> list:
    """A versions record's ``[[episode, version, steps]]``; a record of another shape is a located RecordError."""
    pairs = record.get("pairs", []) if isinstance(record, dict) else None
    if not (isinstance(pairs, list) and all(
            isinstance(p, list) and len(p) == 3 and _int(p[0]) and (p[1] is None or _int(p[1]))
            and _int(p[2]) for p in pairs)):
        raise RecordError(path, "not a record of policy versions ({pairs: [[episode, version, steps]]})",
                          line=line, hint=RECORD_HINT)
    return pairs


ZLIB = b"x"  # a blob's first byte when it is a zlib stream (the bytes of a seed state begin with "topo.state")
RECORD_HINT = "topo reads the records a run of this topo wrote, as it wrote them; keep or copy a run directory whole"
_EVENTS = ("start", "steps", "end")


def blob_bytes(text: str) -> bytes:
    """A seed-state blob from its record text: base64 of its bytes, or of their zlib stream (:data:`ZLIB`), inflated
    to at most :data:`~topo.compiler.limits.MAX_RECORD_BYTES`. ValueError says what it is instead."""
    raw = base64.b64decode(text, validate=True)
    if raw[:1] != ZLIB:
        return raw
    inflate = zlib.decompressobj()
    try:
        out = inflate.decompress(raw, MAX_RECORD_BYTES)
    except zlib.error as err:
        raise ValueError(f"not a zlib stream ({err})") from None
    if not inflate.eof or inflate.unconsumed_tail:
        raise ValueError(f"a zlib stream cut short, or of more than {count(MAX_RECORD_BYTES)} bytes")
    return out


def _int(value: Any) -> bool:
    return type(value) is int


def _strings(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _life_problem(record: Any, life: str) -> str | None:
    """What makes ``record`` no record of worker life ``life`` (None: it is one)."""
    if not isinstance(record, dict) or record.get("event") not in _EVENTS or not _int(record.get("id")):
        return "not an episode record (a JSON object with an event start, steps or end, and an int id)"
    try:
        key = EpisodeId.of(record["id"])
    except ValueError as err:
        return str(err)
    if key.life != life:
        return f"a record of episode {key}, of worker life {key.life}, in the records of {life}"
    if record["event"] == "start" and not (_strings(record.get("state")) and _strings(record.get("blobs") or {})
                                           and _strings(record.get("unrecorded") or {})):
        return f"episode {key}'s start record has a state, blobs or unrecorded that is not a mapping of str to str"
    if record["event"] == "steps":
        at = record.get("at")
        if not (isinstance(at, list) and len(at) == 2 and all(_int(n) and n >= 0 for n in at)):
            return f"episode {key}'s steps record has no [offset, length] of its steps"
        if at[1] > MAX_STEPS_BYTES:
            return f"episode {key}'s steps take {count(at[1])} bytes (limit {count(MAX_STEPS_BYTES)})"
    return None


def joined(blobs: list[bytes], path: str = "<steps>") -> dict[str, Any]:
    """Chunks of recorded steps (``.npz`` blobs, in order) as one episode's arrays. Imports numpy."""
    import io

    import numpy as np

    parts: dict[str, list] = {}
    for blob in blobs:
        for key, value in arrays(io.BytesIO(blob), path, MAX_STEPS_BYTES).items():
            parts.setdefault(key, []).append(value)
    try:
        return {key: np.concatenate(values) for key, values in parts.items()}
    except ValueError as err:
        raise RecordError(path, f"its chunks of steps do not join: {err}", hint=RECORD_HINT) from None


def arrays(source: Any, path: str, limit: int) -> dict[str, Any]:
    """The arrays of an ``.npz`` (a file or a stream), numbers only: never a pickle, at most ``limit`` bytes
    uncompressed (checked before any is read). :class:`~topo.errors.RecordError` says what it holds instead."""
    import zipfile


    try:
        with zipfile.ZipFile(source) as archive:
            members = archive.infolist()
            total = sum(m.file_size for m in members)
            if total > limit:
                raise RecordError(path, f"its arrays take {count(total)} bytes (limit {count(limit)})")
            out = {}
            for member in members:
                name = member.filename[:-len(".npy")] if member.filename.endswith(".npy") else member.filename
                with archive.open(member) as f:
                    out[name] = _npy(f, member.file_size, path, name)
            return out
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as err:
        raise RecordError(path, f"not an .npz of arrays ({type(err).__name__}: {err})",
                          hint="np.savez(path, name=array, ...) writes one") from None


def _npy(f, size: int, path: str, name: str):
    """One ``.npy`` member of ``size`` bytes: its header read first, numbers only, its shape within its bytes."""
    import numpy as np

    fmt = np.lib.format
    version = fmt.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"array {name!r} has .npy format version {version}")
    shape, fortran, dtype = (fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0)(f)
    if dtype.kind not in "biufc" or dtype.fields is not None:
        raise RecordError(path, f"its array {name!r} holds {dtype} values, not numbers: topo reads numbers only")
    nbytes = dtype.itemsize
    for n in shape:
        nbytes *= n
    if nbytes > size:
        raise ValueError(f"array {name!r} of shape {shape} needs {nbytes:,} bytes, its member holds {size:,}")
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError(f"array {name!r} is cut short")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C").copy()


def _plan(run_dir: str) -> dict[str, Any] | None:
    """The plan a run directory's ``launch.json`` holds (None: none, or not a mapping)."""
    path = os.path.join(run_dir, "launch.json")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PLAN_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_PLAN_BYTES:
        raise RecordError(path, f"more than {count(MAX_PLAN_BYTES)} bytes (limit {count(MAX_PLAN_BYTES)})")
    try:
        launch = json.loads(data)
    except (ValueError, RecursionError) as err:
        raise RecordError(path, f"not JSON ({err})", hint=RECORD_HINT) from None
    plan = launch.get("plan") if isinstance(launch, dict) else None
    return plan if isinstance(plan, dict) else None


def _lines(path: str) -> Iterator[tuple[int, Any]]:
    """(line number, JSON value) of each line of a ``.jsonl`` file, within :data:`MAX_RECORD_BYTES` a line; a
    last line cut short (no newline: a killed worker, or one writing now) is skipped."""
    with open(path, "rb") as f:
        number = 0
        while True:
            line = f.readline(MAX_RECORD_BYTES + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_RECORD_BYTES:
                raise RecordError(path, f"a line of more than {count(MAX_RECORD_BYTES)} bytes (limit "
                                  f"{count(MAX_RECORD_BYTES)})", line=number, hint=RECORD_HINT)
            try:
                yield number, json.loads(line)
            except (ValueError, RecursionError) as err:
                if not line.endswith(b"\n"):
                    return
                raise RecordError(path, f"not a JSON record ({err})", line=number, hint=RECORD_HINT) from None


def find_run(path: str) -> str:
    """The run directory ``path`` names: a run directory itself (it holds ``launch.json``), or a report
    directory (``--report``) holding one or more: the latest. ``FileNotFoundError`` says what was looked for."""
    path = os.fspath(path)
    if os.path.isfile(os.path.join(path, "launch.json")):
        return path
    runs = sorted((os.path.join(path, name) for name in (os.listdir(path) if os.path.isdir(path) else [])
                   if name.startswith("topo-run-") and os.path.isfile(os.path.join(path, name, "launch.json"))),
                  key=os.path.getmtime)
    if not runs:
        raise FileNotFoundError(f"{path} is not a topo run directory (no launch.json) and holds none (topo-run-*): "
                                "keep a run with `topo launch --report DIR` or topo.collector(report_dir=DIR)")
    return runs[-1]
