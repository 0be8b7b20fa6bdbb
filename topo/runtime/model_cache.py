"""Where compiled MuJoCo models are cached, and what is there (``topo cache``). Imports neither torch nor mujoco.

One entry per key (:func:`topo.envs.mujoco_cache.model_key`): ``<key>.mjb``, the model in MuJoCo's binary
format, and ``<key>.json`` beside it (what it holds, its size and crc32; written last, so an ``.mjb``
without its ``.json`` is no entry), plus ``<key>.lock``, the lock its compiling process holds.

The directory: a spec's ``env.options.model_cache`` path if it gives one, else ``$TOPO_MODEL_CACHE``,
else ``$XDG_CACHE_HOME/topo/mujoco`` (``~/.cache/topo/mujoco``). ``TOPO_MODEL_CACHE=off`` turns the
cache off for every worker that inherits it, whatever the spec says.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

CACHE_VAR = "TOPO_MODEL_CACHE"
OFF_VALUES = frozenset({"off", "0", "false", "no", "none"})
ENTRY_FILE = re.compile(r"^[0-9a-f]{64}\.(mjb|json|lock)$")
TEMP_FILE = re.compile(r"^\.[0-9a-f]{64}\.\d+\.(mjb|json)\.tmp$")


def cache_dir(setting: bool | str = True, environ: Mapping[str, str] | None = None) -> Path | None:
    """The cache directory for a ``model_cache`` setting (true, false or a path); None when the cache is off."""
    environ = os.environ if environ is None else environ
    variable = environ.get(CACHE_VAR, "").strip()
    if setting is False or variable.lower() in OFF_VALUES:
        return None
    if isinstance(setting, str):
        return Path(setting).expanduser()
    if variable:
        return Path(variable).expanduser()
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or str(Path.home()), ".cache")
    return Path(base) / "topo" / "mujoco"


@dataclass(frozen=True)
class Entry:
    """One cached model, as its ``.json`` describes it (``label`` says what it is, e.g. a LIBERO task)."""

    key: str
    label: str
    bytes: int
    created: float
    mujoco: str
    compile_s: float | None

    @property
    def path(self) -> str:
        return f"{self.key}.mjb"


def entries(directory: Path) -> list[Entry]:
    """The complete entries under ``directory``, oldest first ([] when it does not exist)."""
    out = []
    for meta in sorted(directory.glob("*.json")) if directory.is_dir() else ():
        if not ENTRY_FILE.match(meta.name):
            continue
        try:
            data = json.loads(meta.read_text())
            out.append(Entry(meta.stem, str(data.get("label", "")), int(data["bytes"]), float(data["created"]),
                             str(data.get("mujoco", "")), data.get("compile_s")))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written or foreign: `clear` removes it, workers recompile it
    return sorted(out, key=lambda e: e.created)


def disk_bytes(directory: Path) -> int:
    """Bytes of every cache file under ``directory``: entries, incomplete ones and leftovers of killed writers."""
    return sum(f.stat().st_size for f in _cache_files(directory))


def clear(directory: Path) -> tuple[int, int]:
    """Delete every cache file under ``directory`` (nothing else there); returns (files, bytes) removed."""
    files = size = 0
    for f in _cache_files(directory):
        try:
            n = f.stat().st_size
            f.unlink()
        except FileNotFoundError:
            continue
        files, size = files + 1, size + n
    return files, size


def _cache_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return [f for f in directory.iterdir() if f.is_file() and (ENTRY_FILE.match(f.name) or TEMP_FILE.match(f.name))]


def human_bytes(n: float) -> str:
    """``262485289`` -> ``262.5 MB``."""
    units, i = ("B", "KB", "MB", "GB"), 0
    while n >= 1000 and i < len(units) - 1:
        n, i = n / 1000, i + 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"
