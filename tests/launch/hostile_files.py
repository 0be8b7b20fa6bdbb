"""Hostile files, made on demand: run directories, steps, actions files and checkpoints as an attacker would
craft them (a pickle whose ``__reduce__`` would create a marker file, in every place a blob or a checkpoint is
read), and as accidents leave them (cut, corrupt, oversized, of another run, of another topo).

Shared by tests/launch/test_hostile_files.py: each case is refused, exit 2, its message located, the marker
never made. The run directory is recorded here, in this process, by the worker's own recorder (a real
ToyVLAEnv, actions kept), as tests/launch/test_provenance_units.py records one.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from topo.compiler.limits import MAX_RECORD_BYTES

SPEC = """
version: 1
name: toy
env: {backend: toy, kwargs: {success_steps: 4, state_dim: 8}}
topology: {subcollectors: 1, workers_per_subcollector: 2}
assignment: {tasks: 0-1, groups: {size: 1, candidate_size: 2}, seeds: {base: 100}}
launch: {record_actions: true}
"""
EPISODE = "w1-r0-e0"  # the episode every replay case asks for
LIFE = "w1.r0"


class Evil:
    """Pickles as a call of ``os.system``: unpickling it creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def evil_pickle(marker: Path) -> bytes:
    return pickle.dumps(Evil(marker))


def evil_npz(marker: Path, name: str = "action") -> bytes:
    """An ``.npz`` whose array is an object array holding :class:`Evil` (``np.load(allow_pickle=True)`` runs it)."""
    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.array([Evil(marker)], dtype=object)})
    return buffer.getvalue()


def evil_checkpoint(marker: Path, path: Path) -> Path:
    """What ``torch.save`` writes of a state dict holding :class:`Evil`: the issue's crafted checkpoint."""
    import torch

    torch.save({"weight": Evil(marker)}, path)
    return path


def record_run(folder: Path) -> Path:
    """A toy run directory: its plan, and worker 1's episodes of 3 steps each, actions kept."""
    import torch
    from torchrl.envs.utils import step_mdp

    import topo
    from topo.envs.recording import wrap
    from topo.envs.toy import build

    (folder / "toy.yaml").write_text(SPEC)
    plan = topo.load(str(folder / "toy.yaml")).to_dict()
    run = folder / "topo-run-base"
    run.mkdir()
    (run / "launch.json").write_text(json.dumps({"plan": plan}))
    for row in plan["subcollectors"][0]["workers"]:
        env = build(dict(row["kwargs"]["env"]))
        env.set_seed(row["seed"])
        env = wrap(env, str(run), row["kwargs"]["worker"], row["seed"], 0, True)
        gen = torch.Generator().manual_seed(0)
        for _ in range(2):
            td = env.reset()
            for _ in range(3):
                td["action"] = torch.rand(4, generator=gen) * 2 - 1
                td = step_mdp(env.step(td))
        env.close()
    return run


# -- editing a copy of the run directory ----------------------------------------------------------------------

def _life(run: Path, life: str = LIFE) -> list[dict]:
    return [json.loads(line) for line in (run / "episodes" / f"{life}.jsonl").read_text().splitlines()]


def _write_life(run: Path, records: list[dict], life: str = LIFE) -> None:
    (run / "episodes" / f"{life}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _start(records: list[dict]) -> dict:
    return next(r for r in records if r["event"] == "start" and r["id"] == _id())


def _id() -> int:
    from topo.runtime.episodes import EpisodeId

    return int(EpisodeId.of(EPISODE))


def put_blob(part: str, blob: bytes, *, digest: bool = True) -> Callable[[Path], None]:
    """Replace the seed-state part ``part`` of the episode's start with ``blob`` (under its own digest, as an
    attacker would recompute it; ``digest=False``: under the digest of the blob it replaces)."""
    def edit(run: Path) -> None:
        records = _life(run)
        start = _start(records)
        key = hashlib.blake2b(blob, digest_size=16).hexdigest() if digest else start["state"][part]
        start["state"][part] = key
        start.setdefault("blobs", {})[key] = base64.b64encode(blob).decode()
        if not digest:  # the recorded blob is written once: every record holding it now holds the other bytes
            for r in records:
                if key in (r.get("blobs") or {}):
                    r["blobs"][key] = base64.b64encode(blob).decode()
        _write_life(run, records)
    return edit


def state(value) -> bytes:
    """A well-formed seed-state blob of ``value`` (:mod:`topo.envs.seed_codec`)."""
    from topo.envs.seed_codec import encode

    return encode(value)


def edit_start(**fields) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        records = _life(run)
        _start(records).update(fields)
        _write_life(run, records)
    return edit


def append_line(text: str, at: int | None = None) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        path = run / "episodes" / f"{LIFE}.jsonl"
        lines = path.read_text().splitlines(keepends=True)
        lines.insert(len(lines) if at is None else at, text)
        path.write_text("".join(lines))
    return edit


def huge_line(run: Path) -> None:
    """A line past MAX_RECORD_BYTES, as a sparse run of zero bytes (no disk used)."""
    path = run / "episodes" / f"{LIFE}.jsonl"
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size + MAX_RECORD_BYTES + 10)


def foreign_life(run: Path) -> None:
    """Worker 0's records under worker 1's name."""
    shutil.copy(run / "episodes" / "w0.r0.jsonl", run / "episodes" / f"{LIFE}.jsonl")


def steps_file(content: bytes) -> Callable[[Path], None]:
    """The steps file replaced by ``content``, every chunk of the episode pointing at all of it."""
    def edit(run: Path) -> None:
        (run / "episodes" / f"{LIFE}.steps").write_bytes(content)
        records = _life(run)
        for r in records:
            if r["event"] == "steps":
                r["at"] = [0, len(content)]
        _write_life(run, records)
    return edit


def steps_at(at: list) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        records = _life(run)
        next(r for r in records if r["event"] == "steps" and r["id"] == _id())["at"] = at
        _write_life(run, records)
    return edit


def launch_json(change: Callable[[dict], None] | str) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        path = run / "launch.json"
        if isinstance(change, str):
            path.write_text(change)
            return
        launch = json.loads(path.read_text())
        change(launch)
        path.write_text(json.dumps(launch))
    return edit


def versions(text: str) -> Callable[[Path], None]:
    def edit(run: Path) -> None:
        (run / "episodes" / "versions.sub0.r0.jsonl").write_text(text)
    return edit


@dataclass(frozen=True)
class Case:
    name: str
    edit: Callable[[Path], None] | None  # applied to a copy of the recorded run directory
    argv: tuple[str, ...]  # after `topo`; RUN stands for the copy, FILE for the case's extra file
    says: tuple[str, ...]  # pieces of the message: the file (and line) and what it holds
    file: bytes | None = None  # written to FILE


def cases(marker: Path) -> list[Case]:
    """Every hostile run file; ``marker`` is the file an evil pickle would create."""
    pickled = evil_pickle(marker)
    replay = ("replay", "RUN", EPISODE)
    out = [Case(f"seed-state-{part}-evil-pickle", put_blob(part, pickled), replay,
                (f"{LIFE}.jsonl: episode {EPISODE}: its {part} state is a pickle, which topo never unpickles",))
           for part in ("torch", "numpy", "random", "env")]
    out += [
        Case("seed-state-digest-mismatch", put_blob("numpy", state(("MT19937",)), digest=False), replay,
             ("its numpy state's blob does not match its digest",)),
        Case("seed-state-blob-missing", edit_start(state={"torch": "0" * 32}), replay,
             ("refers to blob 00000000000000000000000000000000, which no record of its run holds",)),
        Case("seed-state-object-array", put_blob("env", b"topo.state/1\n" + json.dumps({"a": ["|O", [1], 0]}).encode()
                                                 + b"\n" + pickled), replay,
             ("its env state is an array of dtype object (only numbers are read)",)),
        Case("seed-state-newer-topo", put_blob("random", b"topo.state/2\n{}"), replay,
             ("its random state is written by a newer topo ('topo.state/2'",)),
        Case("seed-state-array-cut", put_blob("numpy", state(("MT19937", np.zeros(3, np.uint32)))[:-4]), replay,
             ("its numpy state is an array of shape [3] and dtype uint32 (12 bytes at 0) past the 8 bytes the blob "
              "holds",)),
        Case("seed-state-ints-cut", put_blob("random", state((3, tuple(range(625)), None))[:-4]), replay,
             ("its random state is 625 ints (2,500 bytes at 0) past the 2,496 bytes the blob holds",)),
        Case("seed-state-does-not-fit", put_blob("numpy", state(("MT19937", np.zeros(3, np.uint32), 0, 0, 0.0))),
             replay, (f"episode {EPISODE}: its seed state does not fit this env",)),
        Case("env-state-sets-a-method", put_blob("env", state({"close": ("value", "os:system")})), replay,
             ("its env state sets 'close' (value), which topo never records for this env",)),
        Case("record-of-another-run", edit_start(seed=999), replay,
             (f"episode {EPISODE} was recorded with seed 999, but its worker life in this run's plan has seed 101: "
              "a record of another run",)),
        Case("record-of-another-life", foreign_life, replay,
             (f"{LIFE}.jsonl:1: a record of episode w0-r0-e0, of worker life w0.r0, in the records of {LIFE}",)),
        Case("jsonl-corrupt-line", append_line('{"event": "start", "id": \n', at=1), replay,
             (f"{LIFE}.jsonl:2: not a JSON record",)),
        Case("jsonl-huge-line", huge_line, replay,
             (f"{LIFE}.jsonl:", f"a line of more than {MAX_RECORD_BYTES:,} bytes",)),
        Case("jsonl-wrong-type", append_line('{"event": "start", "id": "w1-r0-e0"}\n'), ("runs", "show", "RUN"),
             (f"{LIFE}.jsonl:", "not an episode record",)),
        Case("jsonl-state-not-a-mapping", edit_start(state=["torch"]), ("runs", "show", "RUN"),
             ("start record has a state, blobs or unrecorded that is not a mapping of str to str",)),
        Case("steps-evil-npz", steps_file(evil_npz(marker, "action.action")), replay,
             (f"{LIFE}.steps: its array 'action.action' holds object values, not numbers",)),
        Case("steps-evil-pickle", steps_file(pickled), replay, (f"{LIFE}.steps: not an .npz of arrays",)),
        Case("steps-past-the-end", steps_at([1_000_000, 100]), replay, ("lie past the file's end",)),
        Case("steps-oversized", steps_at([0, 2**40]), ("runs", "show", "RUN"),
             ("steps take 1,099,511,627,776 bytes (limit",)),
        Case("launch-json-other-topo", launch_json(lambda launch: launch["plan"].update(topo_version="9.0.0")), replay,
             ("launch.json: plan written by topo 9.0.0", "(a run directory of another topo)")),
        Case("launch-json-corrupt", launch_json('{"plan": '), ("runs", "show", "RUN"), ("launch.json: not JSON",)),
        Case("launch-json-not-a-plan", launch_json(lambda launch: launch["plan"].update(subcollectors=7)), replay,
             ("launch.json: its plan is not a topo plan",)),
        Case("versions-wrong-type", versions('{"pairs": "all"}\n'), ("runs", "show", "RUN"),
             ("versions.sub0.r0.jsonl:1: not a record of policy versions",)),
        Case("actions-evil-pickle", None, (*replay, "--actions", "FILE"), ("not an .npz of arrays",), file=pickled),
        Case("actions-evil-npz", None, (*replay, "--actions", "FILE"),
             ("its array 'action' holds object values, not numbers",), file=evil_npz(marker)),
        Case("actions-unknown-key", None, (*replay, "--actions", "FILE"),
             ("file: the actions name 'gripper', which this env does not take (its action keys: action)",),
             file=_npz(gripper=np.zeros((3, 4), np.float32))),
        Case("actions-wrong-shape", None, (*replay, "--actions", "FILE"),
             ("file: the actions 'action' have shape (3, 2): each step's must be (4,)",),
             file=_npz(action=np.zeros((3, 2), np.float32))),
    ]
    return out


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def make(case: Case, base: Path, folder: Path) -> list[str]:
    """A copy of ``base`` edited by ``case`` in ``folder``: the command line's arguments after ``topo``."""
    run = folder / "run"
    shutil.copytree(base, run)
    if case.edit is not None:
        case.edit(run)
    extra = folder / "file"
    if case.file is not None:
        extra.write_bytes(case.file)
    return [str(run) if a == "RUN" else str(extra) if a == "FILE" else a for a in case.argv]

