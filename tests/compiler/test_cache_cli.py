"""``topo cache list|size|clear`` on a directory of hand-written entries (no MuJoCo needed)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from topo.cli import main

KEY_A, KEY_B = "a" * 64, "b" * 64


def entry(directory, key: str, size: int, label: str, created: float) -> None:
    (directory / f"{key}.mjb").write_bytes(b"\0" * size)
    (directory / f"{key}.lock").write_bytes(b"")
    (directory / f"{key}.json").write_text(json.dumps({"key": key, "label": label, "bytes": size, "crc32": 0,
                                                       "created": created, "mujoco": "2.3.7", "compile_s": 3.25}))


def run(*args, **env):
    result = CliRunner().invoke(main, ["cache", *map(str, args)], env=env, prog_name="topo")
    assert "Traceback" not in result.output, result.output
    return result


def test_list_size_and_clear(tmp_path):
    entry(tmp_path, KEY_B, 2500, "libero_object task 1", 1_700_000_100)
    entry(tmp_path, KEY_A, 1500, "libero_spatial task 0", 1_700_000_000)
    (tmp_path / f".{KEY_A}.77.mjb.tmp").write_bytes(b"\0" * 1000)  # left by a killed writer
    (tmp_path / "keep.txt").write_text("not ours")
    total = sum(p.stat().st_size for p in tmp_path.iterdir() if p.name != "keep.txt")  # .mjb, .json, .tmp
    assert 5000 < total < 5500
    listing = run("list", "--dir", tmp_path)
    assert listing.exit_code == 0
    lines = listing.output.splitlines()
    assert [line.split()[:3] for line in lines[:2]] == [["aaaaaaaaaaaa", "1.5", "KB"], ["bbbbbbbbbbbb", "2.5", "KB"]]
    assert "libero_spatial task 0" in lines[0] and "compiled in 3.2 s" in lines[0]
    assert lines[2] == f"2 entries, {total / 1000:.1f} KB in {tmp_path}"
    assert run("size", "--dir", tmp_path, "--bytes").output == f"{total}\n"
    assert run("size", "--dir", tmp_path).output == f"{total / 1000:.1f} KB in 2 entries at {tmp_path}\n"
    cleared = run("clear", "--dir", tmp_path)
    assert cleared.output == f"removed 7 file(s), {total / 1000:.1f} KB from {tmp_path}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]
    assert run("list", "--dir", tmp_path).output == f"0 entries, 0 B in {tmp_path}\n"


def test_default_directory_and_off(tmp_path):
    entry(tmp_path, KEY_A, 10, "x", 1_700_000_000)
    total = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert run("size", "--bytes", TOPO_MODEL_CACHE=str(tmp_path)).output == f"{total}\n"
    off = run("list", TOPO_MODEL_CACHE="off")
    assert off.exit_code == 0 and off.output.startswith("the model cache is off (TOPO_MODEL_CACHE=off)")


def test_warm_needs_a_valid_spec_and_a_mujoco_backend(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nenv: {backend: toy}\ntopology: {subcollectors: 0, workers_per_subcollector: 1}\n")
    assert run("warm", bad).exit_code == 2
    toy = tmp_path / "toy.yaml"
    toy.write_text("version: 1\nenv: {backend: toy}\ntopology: {subcollectors: 1, workers_per_subcollector: 1}\n")
    result = run("warm", toy, "--dir", tmp_path)
    assert result.exit_code == 0 and "nothing to warm" in result.output
    result = run("warm", toy, "--dir", tmp_path, "--first-worker")
    assert result.exit_code == 0 and "nothing to warm" in result.output and "first worker" not in result.output
