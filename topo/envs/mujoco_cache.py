"""The compiled-model cache: an MJCF is compiled once per key, later processes load the binary model.

A LIBERO scene compiles in 3-4 s and loads from MuJoCo's binary format in 0.2-0.35 s; the bytes saved
from a compiled model and from a loaded one are equal, and runs from either are bit-identical. The key
(:func:`model_key`) covers everything that changes the compiled model: the cache format, MuJoCo's
version, the platform, the XML text and every file it references (path, size, mtime).

Concurrency: of the processes that miss one key at once, the one holding ``<key>.lock`` (``fcntl.flock``,
released by the kernel if its holder dies) compiles and saves; the others wait on the lock, see that an
entry was saved, and load it after releasing the lock, all at once (a load, with its size and crc32
check, takes 0.3-1 s: loading under the lock would queue them).
Entries are written to a temporary file and renamed; the ``.json`` (size and crc32) comes last, and a
load checks both, so a truncated, garbled or half-written entry is recompiled and replaced. A cache
that cannot be written only costs the compile. Layout and listing: :mod:`topo.runtime.model_cache`.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import sys
import time
import warnings
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path
from typing import Any, Iterator

FORMAT = 1
#: the <compiler> attribute a relative asset path of each element is resolved against (MuJoCo's rule)
_ASSET_DIRS = {"mesh": "meshdir", "skin": "meshdir", "hfield": "meshdir", "texture": "texturedir"}
_CHUNK = 1 << 24


def model_key(xml: str) -> str | None:
    """The sha256 naming ``xml``'s compiled model; None when the XML or one of its files cannot be read."""
    import mujoco

    files = referenced_files(xml)
    if files is None:
        return None
    digest = hashlib.sha256(json.dumps({
        "format": FORMAT, "mujoco": mujoco.__version__, "mj_version": mujoco.mj_version(),
        "platform": sys.platform, "machine": platform.machine(), "cwd": os.getcwd() if files[1] else None,
    }, sort_keys=True).encode())
    digest.update(xml.encode())
    for path in files[0]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        digest.update(f"\0{path}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return digest.hexdigest()


def referenced_files(xml: str) -> tuple[list[str], bool] | None:
    """The files ``xml`` names (``file``, ``fileright``...), as paths, and whether one of them is relative
    (resolved from the working directory, which then joins the key); None if the XML does not parse."""
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return None
    dirs: dict[str, str] = {}
    for compiler in root.iter("compiler"):
        for attr in ("assetdir", "meshdir", "texturedir"):
            if compiler.get(attr) is not None:
                dirs[attr] = compiler.get(attr)
    paths, relative = [], False
    for element in root.iter():
        for attr, value in element.attrib.items():
            if not attr.startswith("file") or not value:
                continue
            if not os.path.isabs(value):
                relative = True
                base = dirs.get(_ASSET_DIRS.get(element.tag, ""), dirs.get("assetdir", ""))
                value = os.path.join(os.getcwd(), base, value)
            paths.append(os.path.normpath(value))
    return paths, relative


class ModelCache:
    """Compiled MuJoCo models under ``directory``; :meth:`model` returns one and what happened."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    def model(self, xml: str, label: str = ""):
        """``(mujoco.MjModel, event)``; ``event["result"]`` is ``hit`` (loaded), ``miss`` (compiled and saved),
        ``corrupt`` (an unsound entry, compiled and replaced), ``uncacheable`` (a file the XML names cannot
        be read: compiled, not saved) or ``unwritable`` (the directory cannot be written: compiled, not saved)."""
        started = time.monotonic()
        key = model_key(xml)
        if key is None:
            return _compile(xml), self._event("uncacheable", None, started)
        model, corrupt = self._load(key)
        if model is not None:
            return model, self._event("hit", key, started)
        seen = self._stamp(key) if corrupt else None  # the unsound description found, or no entry
        with self._locked(key) as waited:
            if waited is None:  # no lock file (read-only or missing directory): compile, keep nothing
                return _compile(xml), self._event("unwritable", key, started)
            now = self._stamp(key)
            if now is None or now == seen:  # nobody saved it meanwhile: this process compiles
                return self._compile_and_save(xml, key, label, started, corrupt, waited)
        # saved by the process that held the lock: loaded with the lock released, alongside the other waiters
        model, _ = self._load(key)
        if model is not None:
            return model, self._event("hit", key, started, waited_s=waited)
        with self._locked(key) as again:  # saved unsound: compile it here
            return self._compile_and_save(xml, key, label, started, True, again)

    def _compile_and_save(self, xml: str, key: str, label: str, started: float, corrupt: bool, waited: float | None):
        compile_started = time.monotonic()
        model = _compile(xml)
        compile_s = time.monotonic() - compile_started
        saved = waited is not None and self._save(key, model, label, compile_s)
        result = "unwritable" if not saved else "corrupt" if corrupt else "miss"
        return model, self._event(result, key, started, compile_s=compile_s, waited_s=waited)

    def ensure(self, xml: str, label: str = "") -> dict[str, Any]:
        """Compile and save ``xml``'s model unless a sound entry exists (``topo cache warm``); nothing is loaded."""
        started = time.monotonic()
        key = model_key(xml)
        if key is not None and self._intact(key):
            return self._event("hit", key, started)
        return self.model(xml, label)[1]

    def paths(self, key: str) -> tuple[Path, Path]:
        return self.directory / f"{key}.mjb", self.directory / f"{key}.json"

    def _load(self, key: str):
        """``(model, False)``; ``(None, False)`` when there is no entry; ``(None, True)`` when it is unsound."""
        import mujoco

        binary, meta = self.paths(key)
        if not meta.exists():
            return None, False
        if not self._intact(key):
            return None, True
        try:
            return mujoco.MjModel.from_binary_path(str(binary)), False
        except Exception:  # MuJoCo's loader rejects a bad header or sizes with ValueError; anything else alike
            return None, True

    def _stamp(self, key: str) -> tuple[int, int, int] | None:
        """Which description file is there now (inode, mtime, size); None when there is none."""
        try:
            st = self.paths(key)[1].stat()
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _intact(self, key: str) -> bool:
        binary, meta = self.paths(key)
        try:
            expected = json.loads(meta.read_text())
            return _size_and_crc(binary) == (int(expected["bytes"]), int(expected["crc32"]))
        except (OSError, ValueError, KeyError, TypeError):
            return False

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[float | None]:
        """Hold ``<key>.lock``; yields the seconds spent waiting for it, or None when it cannot be created."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / f"{key}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            warnings.warn(f"topo model cache: cannot lock {self.directory}: {exc}; compiling without the cache",
                          RuntimeWarning, stacklevel=3)
            yield None
            return
        try:
            started = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield time.monotonic() - started
        finally:
            os.close(fd)  # releases the lock

    def _save(self, key: str, model, label: str, compile_s: float) -> bool:
        """Write the entry for ``model``, which must be exactly as compiled (robosuite edits it later)."""
        import mujoco

        binary, meta = self.paths(key)
        tmp = self.directory / f".{key}.{os.getpid()}.mjb.tmp"
        try:
            mujoco.mj_saveModel(model, str(tmp), None)
            size, crc = _size_and_crc(tmp)
            meta.unlink(missing_ok=True)  # no reader pairs the new model with the old description
            os.replace(tmp, binary)
            _write_atomic(meta, {"key": key, "label": label, "bytes": size, "crc32": crc, "created": time.time(),
                                 "mujoco": mujoco.__version__, "compile_s": round(compile_s, 3)})
            return True
        except (OSError, ValueError) as exc:
            tmp.unlink(missing_ok=True)
            warnings.warn(f"topo model cache: cannot save {binary}: {exc}", RuntimeWarning, stacklevel=3)
            return False

    def _event(self, result: str, key: str | None, started: float, **extra: Any) -> dict[str, Any]:
        event = {"result": result, "key": key, "dir": str(self.directory), "seconds": round(time.monotonic() - started, 3)}
        if result in ("hit", "miss", "corrupt"):
            with contextlib.suppress(OSError):
                event["bytes"] = self.paths(key)[0].stat().st_size
        event.update({k: round(v, 3) for k, v in extra.items() if v is not None})
        return event


def _compile(xml: str):
    import mujoco

    return mujoco.MjModel.from_xml_string(xml)


def _size_and_crc(path: Path) -> tuple[int, int]:
    crc = size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return size, crc


def _write_atomic(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.json.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)
