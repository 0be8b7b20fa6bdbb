"""The house's boundaries, read from the code (no import runs): the compile half and the runtime every process
shares stay free of the launch half and of torch; engines stay apart; tools use an engine's public names only;
docs/code.md, the map a newcomer reads, names every room there is and no room there is not."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPO = ROOT / "topo"
HEAVY = ("torch", "torchrl", "tensordict", "ray")


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (relative imports resolved)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def files(*places: str) -> list[Path]:
    return sorted(p for place in places for p in ((TOPO / place).rglob("*.py") if (TOPO / place).is_dir()
                                                  else [TOPO / place]))


def offending(paths: list[Path], forbidden) -> list[str]:
    return [f"{p.relative_to(ROOT)} imports {name}" for p in paths for name in sorted(imports(p)) if forbidden(name)]


def under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_compiler_and_the_runtime_import_no_launch_no_env_and_no_torch():
    bad = offending(files("compiler", "runtime"), lambda n: under(n, "topo.launch", "topo.envs", *HEAVY))
    assert bad == []


def test_the_compiler_reads_no_runtime_and_the_runtime_no_compiler():
    assert offending(files("compiler"), lambda n: under(n, "topo.runtime", "topo.doctor", "topo.runs")) == []
    # the one exception: the bounds on every input topo reads (specs, plans, records), in compiler/limits.py
    assert offending(files("runtime"), lambda n: under(n, "topo.compiler", "topo.doctor", "topo.runs")
                     and not under(n, "topo.compiler.limits")) == []


def test_supervision_is_engine_neutral_and_torch_free():
    assert offending(files("launch/supervision"), lambda n: under(n, "topo.launch.local", "topo.launch.ray", *HEAVY)) == []


def test_no_engine_reads_another_engines_module():
    assert offending(files("launch/local"), lambda n: under(n, "topo.launch.ray")) == []
    assert offending(files("launch/ray"), lambda n: under(n, "topo.launch.local")) == []


def test_outside_its_folder_an_engine_is_read_through_its_public_names_only():
    inside = {*files("launch/local"), *files("launch/ray")}
    others = [p for p in files("") if p not in inside]
    private = re.compile(r"^topo\.launch\.(local|ray)\.\w+$")
    public = {f"topo.launch.{e}.{n}" for e, pkg in (("local", "topo.launch.local"), ("ray", "topo.launch.ray"))
              for n in __import__(pkg, fromlist=["__all__"]).__all__}
    assert offending(others, lambda n: bool(private.match(n)) and n not in public) == []


def test_the_top_level_holds_the_face_and_the_ground_only():
    modules = sorted(p.name for p in TOPO.glob("*.py"))
    assert len(modules) <= 10, modules
    assert "worker.py" in modules  # saved plans name topo.worker (the forkserver preload list): it stays


@pytest.mark.parametrize("room", sorted(
    str(p.relative_to(ROOT)) + ("/" if p.is_dir() else "") for p in [*TOPO.glob("*"), *(TOPO / "launch").glob("*")]
    if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))))
def test_docs_code_md_names_every_room(room):
    assert f"`{room}`" in (ROOT / "docs" / "code.md").read_text(), f"docs/code.md does not name {room}"


def test_every_path_docs_code_md_names_exists():
    text = (ROOT / "docs" / "code.md").read_text()
    named = set(re.findall(r"`(topo/[\w/.]+)`", text))
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert named and missing == []
