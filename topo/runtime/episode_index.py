"""An index of a run's episode records: what ``topo runs show`` filters and looks up without reading every record.

Beside each records file of an episodes folder (:mod:`topo.runtime.episodes`: a worker life's ``<life>.jsonl``, a
subcollector's ``versions.sub<c>.r<k>.jsonl``) topo keeps ``.index/<name>.idx``: a header and columns of 8-byte
numbers, one row per episode (id, start time, the byte offsets of its start and end lines, return, success, eval
episode number) or per (episode, policy version) pair. The first reader that needs an index makes it; a later one
extends it with the file's new bytes only. It covers the file up to a byte offset and holds the file's inode and a
digest of the bytes just before that offset, so that a file rewritten (retention, a copy) is indexed again.

The records stay the source of truth: an index missing, stale, cut short or corrupt (its CRC) is rebuilt from
them; where the folder cannot be written it is built in memory only. An index is numbers read with :mod:`struct`,
never code, and what a row points at is checked when read: a line that is not its episode's is a
:class:`~topo.errors.RecordError` naming the index. Pure: imports neither torch nor numpy.
"""
from __future__ import annotations

import hashlib
import json
import math
import operator
import os
import struct
import zlib
from array import array
from typing import Any, Iterator

from topo.compiler.limits import MAX_RECORD_BYTES, count
from topo.errors import RecordError
from topo.runtime.episodes import (RECORD_HINT, Episode, EpisodeId, _life_problem, _plan, find_run, plan_rows,
                                   record_files, record_folders, version_pairs)

FOLDER = ".index"  # in an episodes folder
HEADER = struct.Struct("<8sQQQ16sQI4x")  # magic, inode, bytes covered, lines covered, digest of the last, rows, crc32
TAIL = 64  # bytes before the covered offset whose digest says the file was only appended to since
NONE = -(1 << 63)  # an integer column's None
SUCCESS = {None: 0, False: 1, True: 2}  # flags bits 0-1; bit 2: the end record has a return
HAS_RETURN = 4
INDEX_HINT = "an index is made from the records again when it is removed: delete the episodes folder's .index"


class FileIndex:
    """The index of one records file, made or brought up to date when constructed: ``columns`` by name."""

    MAGIC = b""
    COLUMNS: tuple[str, ...] = ()
    FLOATS: frozenset[str] = frozenset()

    def __init__(self, path: str):
        self.path = path
        name = os.path.basename(path)[:-len(".jsonl")]
        self.cache = os.path.join(os.path.dirname(path), FOLDER, name + ".idx")
        self.name = name
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            loaded = self._load(f, st)
            if loaded is None:
                self.ino, self.covered, self.lines = st.st_ino, 0, 0
                self.columns = {c: array("d" if c in self.FLOATS else "q") for c in self.COLUMNS}
            if self.covered < st.st_size:
                self._extend(f)

    def __len__(self) -> int:
        return len(self.columns[self.COLUMNS[0]])

    def _load(self, f, st) -> bool | None:
        """The index file's columns, when it is this file's and whole (None: make it again)."""
        try:
            with open(self.cache, "rb") as g:
                data = g.read(HEADER.size + (st.st_size + 1) * len(self.COLUMNS) * 8)  # never more rows than bytes
        except OSError:
            return None
        if len(data) < HEADER.size:
            return None
        magic, ino, covered, lines, tail, rows, crc = HEADER.unpack_from(data)
        body = memoryview(data)[HEADER.size:]
        if (magic != self.MAGIC or ino != st.st_ino or covered > st.st_size or len(body) != rows * 8 * len(self.COLUMNS)
                or zlib.crc32(body) != crc or _tail(f, covered) != tail):
            return None
        self.ino, self.covered, self.lines = ino, covered, lines
        self.columns = {c: body[i * rows * 8:(i + 1) * rows * 8].cast("d" if c in self.FLOATS else "q")
                        for i, c in enumerate(self.COLUMNS)}
        return True

    def _extend(self, f) -> None:
        """Read the file's lines past what the index covers (each within bounds, as :func:`~topo.runtime.episodes._lines`
        does), index them, and keep the index; a last line without its newline counts now, and is read again next time."""
        self.columns = {c: array(v.format, v.tobytes()) if isinstance(v, memoryview) else v
                        for c, v in self.columns.items()}
        self._begin()
        f.seek(self.covered)
        offset, number, last = self.covered, self.lines, None
        while True:
            line = f.readline(MAX_RECORD_BYTES + 1)
            if not line:
                break
            number += 1
            if len(line) > MAX_RECORD_BYTES:
                raise RecordError(self.path, f"a line of more than {count(MAX_RECORD_BYTES)} bytes (limit "
                                  f"{count(MAX_RECORD_BYTES)})", line=number, hint=RECORD_HINT)
            try:
                record = json.loads(line)
            except (ValueError, RecursionError) as err:
                if not line.endswith(b"\n"):
                    break
                raise RecordError(self.path, f"not a JSON record ({err})", line=number, hint=RECORD_HINT) from None
            if not line.endswith(b"\n"):
                last = (number, offset, record)
                break
            self._apply(number, offset, record)
            offset += len(line)
            self.covered, self.lines = offset, number
        self._finish()
        self._save(f)
        if last is not None:  # complete, but not yet kept: the writer may still be writing it
            self._begin()
            self._apply(*last)
            self._finish()

    def _save(self, f) -> None:
        """Write the index atomically beside the records; a folder that cannot be written keeps it in memory only."""
        body = b"".join(self.columns[c].tobytes() for c in self.COLUMNS)
        header = HEADER.pack(self.MAGIC, self.ino, self.covered, self.lines, _tail(f, self.covered), len(self),
                             zlib.crc32(body))
        tmp = f"{self.cache}.{os.getpid()}.tmp"
        try:
            os.makedirs(os.path.dirname(self.cache), exist_ok=True)
            with open(tmp, "wb") as g:
                g.write(header + body)
            os.replace(tmp, self.cache)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    def _begin(self) -> None:
        pass

    def _finish(self) -> None:
        pass

    def _apply(self, line: int, offset: int, record: Any) -> None:
        raise NotImplementedError


class LifeIndex(FileIndex):
    """A worker life's episodes, one row each in the order they started: ``start``/``end``, the offsets of its start
    and end lines (``end`` :data:`NONE`: open); ``flags``: success and whether a return was recorded."""

    MAGIC = b"topoIL1\n"
    COLUMNS = ("id", "time", "start", "end", "return", "flags", "eval_episode")
    FLOATS = frozenset({"time", "return"})

    def _begin(self) -> None:
        self._at = {value: i for i, value in enumerate(self.columns["id"])}

    def _apply(self, line: int, offset: int, record: Any) -> None:
        problem = _life_problem(record, self.name) or _values_problem(record)
        if problem:
            raise RecordError(self.path, problem, line=line, hint=RECORD_HINT)
        value, event, c = record["id"], record["event"], self.columns
        if event == "start":
            number = record.get("eval_episode")
            row = (value, float(record.get("time") or 0.0), offset, NONE, math.nan, 0, NONE if number is None else number)
            i = self._at.get(value)
            if i is None:
                self._at[value] = len(c["id"])
                for name, v in zip(self.COLUMNS, row):
                    c[name].append(v)
            else:
                for name, v in zip(self.COLUMNS, row):
                    c[name][i] = v
        elif event == "end" and value in self._at:
            i, ret = self._at[value], record.get("return")
            c["end"][i] = offset
            c["return"][i] = math.nan if ret is None else float(ret)
            ok = record.get("success")
            c["flags"][i] = (SUCCESS[ok] if type(ok) is bool else 0) | (0 if ret is None else HAS_RETURN)


class VersionsIndex(FileIndex):
    """A subcollector's (episode, policy version, steps) pairs, summed over the lines indexed at once (a version
    :data:`NONE`: steps no version stamped)."""

    MAGIC = b"topoIV1\n"
    COLUMNS = ("episode", "version", "steps")

    def _begin(self) -> None:
        self._sums: dict[tuple[int, int], int] = {}

    def _apply(self, line: int, offset: int, record: Any) -> None:
        for value, version, steps in version_pairs(record, self.path, line):
            if value >= 0:  # an eval worker's idle steps belong to no episode
                key = (value, NONE if version is None else version)
                self._sums[key] = self._sums.get(key, 0) + steps

    def _finish(self) -> None:
        c = self.columns
        for (value, version), steps in self._sums.items():
            c["episode"].append(value)
            c["version"].append(version)
            c["steps"].append(steps)
        self._sums = {}


class Index:
    """A run's episodes read through the indexes of its records (``run``: as :class:`~topo.runtime.episodes.Episodes`
    takes it): the same episodes and summaries, :meth:`select` and :meth:`get` without reading every record."""

    def __init__(self, run: str | os.PathLike[str]):
        self.run_dir = find_run(os.fspath(run))
        self.plan = _plan(self.run_dir)
        self._rows: dict[tuple[bool, int], dict[str, Any]] | None = None
        self._folders = [(folder, *record_files(folder)) for folder in record_folders(self.run_dir)]
        self._versions: dict[str, list[VersionsIndex]] = {}
        self._sets: dict[tuple[str, int], set[int]] = {}

    def lives(self) -> Iterator[tuple[str, LifeIndex]]:
        for folder, lives, _ in self._folders:
            for path in lives:
                yield folder, LifeIndex(path)

    def __len__(self) -> int:
        return sum(len(life) for _, life in self.lives())

    def get(self, value: int | str | EpisodeId) -> Episode:
        """The episode of an id; KeyError naming the run directory when it has none."""
        key = EpisodeId.of(value)
        for folder, lives, _ in self._folders:
            path = os.path.join(folder, key.life + ".jsonl")
            if path in lives:
                life = LifeIndex(path)
                ids = life.columns["id"]
                for i in range(len(life)):
                    if ids[i] == int(key):
                        return self._episodes(folder, [(life, i)])[0]
        raise KeyError(f"run {self.run_dir} recorded no episode {key}")

    def select(self, *, task: int | None = None, worker: int | None = None, subcollector: int | None = None,
               version: int | None = None, min_return: float | None = None, max_return: float | None = None,
               success: bool | None = None, eval: bool | None = None, limit: int | None = None
               ) -> tuple[int, int, list[Episode]]:
        """(episodes recorded, episodes matching every filter given, the first ``limit`` of them in
        :class:`~topo.runtime.episodes.Episodes`' order: training first, by start time, then id)."""
        recorded, matched, chosen = 0, 0, []
        for folder, life in self.lives():
            recorded += len(life)
            key = EpisodeId.of(life.columns["id"][0]) if len(life) else None
            if key is None or (eval is not None and key.eval is not eval) or (worker is not None and key.row != worker):
                continue
            row = self.row(key)
            if subcollector is not None and row.get("subcollector") != subcollector:
                continue
            keep = self._matching(folder, life, key, row, task, version, min_return, max_return, success)
            matched += len(keep)
            c = life.columns
            if limit is not None and len(keep) > limit and _ordered(c["time"], c["id"]):
                keep = keep[:limit]
            chosen += [(key.eval, c["time"][i], c["id"][i], folder, life, i) for i in keep]
        chosen.sort(key=lambda x: x[:3])
        chosen = chosen if limit is None else chosen[:limit]
        read: dict[tuple[str, int], Episode] = {}
        for folder in dict.fromkeys(x[3] for x in chosen):
            rows = [(life, i) for _, _, _, f, life, i in chosen if f == folder]
            read.update(((life.path, i), e) for (life, i), e in zip(rows, self._episodes(folder, rows)))
        return recorded, matched, [read[life.path, i] for _, _, _, _, life, i in chosen]

    def row(self, key: EpisodeId) -> dict[str, Any]:
        if self._rows is None:
            self._rows = plan_rows(self.plan, self.run_dir)
        return self._rows.get((key.eval, key.row), {})

    def _matching(self, folder: str, life: LifeIndex, key: EpisodeId, row: dict, task, version, min_return,
                  max_return, success) -> list[int]:
        c, keep = life.columns, range(len(life))
        if task is not None:
            if key.eval:  # an eval row's episodes each have their planned task
                planned: dict = {}
                for entry in row.get("episodes") or []:
                    planned.setdefault(entry.get("episode"), entry.get("task_id", row.get("task_id")))
                numbers, default = c["eval_episode"], row.get("task_id")
                keep = [i for i in keep if (planned.get(numbers[i], default) if numbers[i] != NONE else default) == task]
            elif row.get("task_id") != task:
                return []
        if version is not None:
            acted = self._acted(folder, version)
            ids = c["id"]
            keep = [i for i in keep if ids[i] in acted]
        if min_return is not None or max_return is not None:
            flags, ret = c["flags"], c["return"]
            lo = -math.inf if min_return is None else min_return
            hi = math.inf if max_return is None else max_return
            keep = [i for i in keep if flags[i] & HAS_RETURN and not ret[i] < lo and not ret[i] > hi]
        if success is not None:
            flags, code = c["flags"], SUCCESS[success]
            keep = [i for i in keep if flags[i] & 3 == code]
        return list(keep)

    def _acted(self, folder: str, version: int) -> set[int]:
        """The episodes of ``folder`` in which policy ``version`` acted."""
        if (folder, version) not in self._sets:
            self._sets[folder, version] = {e for v in self._versions_of(folder)
                                           for e, n in zip(v.columns["episode"], v.columns["version"]) if n == version}
        return self._sets[folder, version]

    def _versions_of(self, folder: str) -> list[VersionsIndex]:
        if folder not in self._versions:
            paths = next(v for f, _, v in self._folders if f == folder)
            self._versions[folder] = [VersionsIndex(path) for path in paths]
        return self._versions[folder]

    def _episodes(self, folder: str, rows: list[tuple[LifeIndex, int]]) -> list[Episode]:
        """The episodes at these rows, read from their records (start, steps and end lines) and joined with their
        plan rows and policy versions."""
        out = [self._read(folder, life, i) for life, i in rows]
        wanted = {int(e.id): e for e in out}
        for v in self._versions_of(folder):
            for value, version, steps in zip(*(v.columns[c] for c in VersionsIndex.COLUMNS)):
                e = wanted.get(value)
                if e is not None:
                    version = None if version == NONE else version
                    e.versions[version] = e.versions.get(version, 0) + steps
        return out

    def _read(self, folder: str, life: LifeIndex, i: int) -> Episode:
        c = life.columns
        key, start, end = EpisodeId.of(c["id"][i]), c["start"][i], c["end"][i]
        found: Episode | None = None
        with open(life.path, "rb") as f:
            f.seek(start)
            while True:
                at = f.tell()
                line = f.readline(MAX_RECORD_BYTES + 1)
                try:
                    record = json.loads(line) if line and len(line) <= MAX_RECORD_BYTES else None
                except (ValueError, RecursionError):
                    record = None
                if found is None:
                    if not (isinstance(record, dict) and record.get("event") == "start" and record.get("id") == int(key)
                            and not _life_problem(record, life.name)):
                        raise RecordError(life.cache, f"row {i:,} says episode {key} starts at byte {start:,} of "
                                          f"{life.path}, which holds no start record of it there", hint=INDEX_HINT)
                    found = Episode(key, self.row(key), record, folder=folder)
                    continue
                if not isinstance(record, dict) or (end != NONE and at > end) or record.get("event") == "start":
                    break  # the next episode (an open one's lines end where it starts), or the end of what was written
                if record.get("id") != int(key) or _life_problem(record, life.name):
                    continue
                if record["event"] == "steps":
                    found.chunks.append(record["at"])
                elif record["event"] == "end":
                    found.end = record
                    if at == end:
                        break
        return found


def _values_problem(record: dict) -> str | None:
    """What makes the values an index keeps of ``record`` (a start's time and eval episode, an end's return) no
    numbers (None: they are)."""
    names = {"start": ("time", "eval_episode"), "end": ("return",)}.get(record["event"], ())
    for name in names:
        value = record.get(name)
        if not (value is None or type(value) is int and NONE < value < 1 << 63 or type(value) is float and name != "eval_episode"):
            return f"episode {EpisodeId.of(record['id'])}'s {record['event']} record has a {name} that is no number"
    return None


def _ordered(times, ids) -> bool:
    """Whether a life's rows are in (start time, id) order already (its first rows are then its first episodes)."""
    return all(map(operator.le, times, times[1:])) and all(map(operator.lt, ids, ids[1:]))


def _tail(f, covered: int) -> bytes:
    f.seek(max(0, covered - TAIL))
    return hashlib.blake2b(f.read(min(covered, TAIL)), digest_size=16).digest()
