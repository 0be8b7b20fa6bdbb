"""Episode records that stay small and fast: the index ``topo runs show`` reads (the same rows as the records), an index
cut short or corrupt (rebuilt, or refused where it points elsewhere), retention, and its spec setting."""
from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torchrl.envs.utils import step_mdp

from topo.cli import main
from topo.envs.recording import LifeWriter, wrap
from topo.envs.toy import build
from topo.runtime.episode_index import HEADER, Index, LifeIndex
from topo.runtime.episodes import EpisodeId, Episodes, versions_file
from topo.runs.replay import replay

SPEC = """version: 1
name: toy
env: {backend: toy, kwargs: {success_steps: 4, state_dim: 8}}
topology: {subcollectors: 2, workers_per_subcollector: 2}
assignment: {tasks: 0-1, groups: {size: 1, candidate_size: 2}, seeds: {base: 100}}
"""
FILTERS = [{}, {"task": 1}, {"task": 0}, {"worker": 2}, {"subcollector": 1}, {"version": 1}, {"version": 0},
           {"min_return": 0.5}, {"max_return": 0.5}, {"min_return": 0.2, "max_return": 0.8}, {"success": True},
           {"success": False}, {"eval": True}, {"eval": False}, {"task": 1, "success": False}]


@pytest.fixture(scope="module")
def toy_plan(tmp_path_factory) -> dict:
    import topo

    path = tmp_path_factory.mktemp("spec") / "toy.yaml"
    path.write_text(SPEC)
    return topo.load(str(path)).to_dict()


def _runs(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(map(str, args)))
    return result.exit_code, result.output


def write_records(run_dir, plan, episodes: int, seed: int = 0, first: int = 0) -> None:
    """Each plan row's worker life (and one eval life) with ``episodes`` episodes from ordinal ``first``, as
    :class:`LifeWriter` writes them: seed-state blobs (some recurring), steps lines, a last one left open, and
    each subcollector's policy versions (one step without a version)."""
    rng = np.random.default_rng(seed)
    rows = [r for sub in plan["subcollectors"] for r in sub["workers"]]
    lives = [(r["global_index"], False) for r in rows] + [(0, True)]
    for row, is_eval in lives:
        writer = LifeWriter(str(run_dir), EpisodeId(row, 0, 0, eval=is_eval).life)
        for e in range(first, first + episodes):
            value = int(EpisodeId(row, 0, e, eval=is_eval))
            refs, new, _ = writer.blobs({"numpy": np.arange(8) * (e % 3), "env": {"count": e}})
            writer.write({"event": "start", "id": value, "time": 1000.0 + e + row / 10, "seed": 100 + row,
                          "state": refs, "init_state": None, "group_id": e, "instruction": "lift",
                          **({"eval_round": 1, "eval_episode": e} if is_eval else {}), **({"blobs": new} if new else {})})
            writer.write({"event": "steps", "id": value, "at": [e * 10, 10]})
            if e < first + episodes - 1 or row % 2:
                ok = [True, False, None][int(rng.integers(3))]
                writer.write({"event": "end", "id": value, "time": 1000.5 + e, "steps": 4,
                              "return": round(float(rng.random()), 3), "how": "terminated", "success": ok})
        writer.close()
    for sub in plan["subcollectors"]:
        with open(versions_file(str(run_dir), sub["index"], 0), "a") as f:
            for e in range(first, first + episodes):
                pairs = [[int(EpisodeId(r["global_index"], 0, e)), e % 2 or None, 2] for r in sub["workers"]]
                f.write(json.dumps({"batch": e, "time": 0.0, "pairs": pairs}) + "\n")


@pytest.fixture
def run_dir(tmp_path, toy_plan):
    (tmp_path / "launch.json").write_text(json.dumps({"plan": toy_plan}))
    write_records(tmp_path, toy_plan, 6)
    return tmp_path


def same_rows(run) -> None:
    """Every filter, with and without a limit, and every episode looked up: the index's answer is the records'."""
    records, index = Episodes(run), Index(run)
    for filters in FILTERS:
        expected = [e.summary() for e in records.select(**filters)]
        for limit in (None, 0, 3):
            recorded, matched, chosen = index.select(**filters, limit=limit)
            assert (recorded, matched) == (len(records), len(expected)), filters
            assert [e.summary() for e in chosen] == expected[:limit], (filters, limit)
    for e in records:
        found = index.get(e.id)
        assert (found.start, found.end, found.chunks, found.versions) == (e.start, e.end, e.chunks, e.versions)


def test_the_index_gives_the_rows_the_records_give_and_grows_with_them(run_dir, toy_plan):
    same_rows(run_dir)
    assert sorted(p.name for p in (run_dir / "episodes" / ".index").iterdir()) == [
        "eval-w0.r0.idx", "versions.sub0.r0.idx", "versions.sub1.r0.idx", "w0.r0.idx", "w1.r0.idx", "w2.r0.idx",
        "w3.r0.idx"]
    before = LifeIndex(str(run_dir / "episodes" / "w1.r0.jsonl")).covered
    write_records(run_dir, toy_plan, 4, seed=1, first=6)  # the run went on: the index reads the new bytes only
    same_rows(run_dir)
    life = LifeIndex(str(run_dir / "episodes" / "w1.r0.jsonl"))
    assert before < life.covered == (run_dir / "episodes" / "w1.r0.jsonl").stat().st_size and len(life) == 10
    code, out = _runs("runs", "show", run_dir, "--task", 1, "--limit", 2, "--format", "json")
    assert code == 0 and [e["id"] for e in json.loads(out)] == ["w1-r0-e0", "w3-r0-e0"]
    code, out = _runs("runs", "show", run_dir, "w3-r0-e9")
    assert code == 0 and json.loads(out)["end"]["steps"] == 4 and json.loads(out)["steps_by_version"] == {"1": 2}


def test_records_rewritten_under_the_same_name_are_indexed_again(run_dir, toy_plan):
    same_rows(run_dir)
    life = run_dir / "episodes" / "w0.r0.jsonl"
    lines = life.read_bytes().splitlines(keepends=True)
    life.with_suffix(".new").write_bytes(b"".join(lines[:6]) + b"".join(lines[:3]))  # as long, not an append
    life.with_suffix(".new").replace(life)
    same_rows(run_dir)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "other magic"])
def test_an_index_cut_short_or_corrupt_is_made_again_from_the_records(run_dir, damage):
    same_rows(run_dir)
    index = run_dir / "episodes" / ".index" / "w1.r0.idx"
    data = bytearray(index.read_bytes())
    if damage == "truncated":
        data = data[:len(data) - 13]
    elif damage == "flipped":
        data[-20] ^= 0xFF
    elif damage == "empty":
        data = bytearray()
    else:
        data[:8] = b"topoIX9\n"
    index.write_bytes(bytes(data))
    same_rows(run_dir)
    assert index.read_bytes()[:8] == b"topoIL1\n" and len(index.read_bytes()) > HEADER.size


def test_an_index_that_points_at_another_line_is_refused_naming_it(run_dir):
    same_rows(run_dir)
    index = run_dir / "episodes" / ".index" / "w1.r0.idx"
    data = bytearray(index.read_bytes())
    magic, ino, covered, lines, tail, rows, _ = HEADER.unpack_from(data)
    start = HEADER.size + 2 * rows * 8  # the start column: row 0 now points at the second line (a steps line)
    struct.pack_into("<q", data, start, struct.unpack_from("<q", data, start + 8)[0] - 1)
    data[:HEADER.size] = HEADER.pack(magic, ino, covered, lines, tail, rows, zlib.crc32(data[HEADER.size:]))
    index.write_bytes(bytes(data))
    code, out = _runs("runs", "show", run_dir, "--worker", 1)
    assert code == 2 and "w1.r0.idx" in out and "row 0 says episode w1-r0-e0 starts at byte" in out
    assert "delete the episodes folder's .index" in out and "Traceback" not in out


def test_retention_keeps_exactly_the_last_n_episodes_and_they_replay(tmp_path, toy_plan):
    (tmp_path / "launch.json").write_text(json.dumps({"plan": toy_plan}))
    row = toy_plan["subcollectors"][0]["workers"][1]
    env = build(dict(row["kwargs"]["env"]))
    env.set_seed(row["seed"])
    env = wrap(env, str(tmp_path), row["kwargs"]["worker"], row["seed"], 0, True, keep=3)
    held = []
    gen = torch.Generator().manual_seed(0)
    td = env.reset()
    for e in range(10):
        for _ in range(3):
            td["action"] = torch.rand(4, generator=gen) * 2 - 1
            td = step_mdp(env.step(td))
        td = env.reset()
        held.append(len(Episodes(str(tmp_path))))
    env.close()
    assert max(held) <= 6 and min(held[3:]) >= 3  # between N and 2N while the life runs
    kept = Episodes(str(tmp_path))
    assert [str(e.id) for e in kept] == ["w1-r0-e8", "w1-r0-e9", "w1-r0-e10"]  # N once the life closed
    assert replay(str(tmp_path), "w1-r0-e9").identical  # its seed state's blobs moved to the kept records
    same_rows(tmp_path)


def test_retention_is_a_spec_setting_the_plan_carries_and_a_bad_value_is_located(tmp_path):
    import topo

    good = tmp_path / "good.yaml"
    good.write_text(SPEC + "launch: {retain_episodes: 500}\n")
    assert topo.load(str(good)).to_dict()["launch"]["retain_episodes"] == 500
    for bad in ("0", "-3", "lots", "2.5"):
        path = tmp_path / "bad.yaml"
        path.write_text(SPEC + f"launch:\n  retain_episodes: {bad}\n")
        code, out = _runs("validate", path)
        assert code == 2 and "bad.yaml:7" in out and "retain_episodes" in out, out
