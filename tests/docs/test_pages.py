"""The docs build with warnings as errors; their generated parts are current; the schema's defaults are
the ones topo fills in."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.docs.blocks import ROOT, all_blocks

sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import topo_docs  # noqa: E402


def test_sphinx_build_has_no_warning(tmp_path):
    """Its length (33 s beside two CPU hogs): a whole Sphinx build of docs/, in a process of its own."""
    pytest.importorskip("sphinx", reason="the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("myst_parser", reason="the docs extra: pip install -e '.[docs]'")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(ROOT / "docs"), str(tmp_path / "html")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    for page in ("index", "getting-started", "reference/spec", "reference/cli", "reference/api"):
        assert (tmp_path / "html" / f"{page}.html").is_file(), page
    spec = (tmp_path / "html" / "reference" / "spec.html").read_text(encoding="utf-8")
    assert "placement.nodes[].memory_gb" in spec
    api = (tmp_path / "html" / "reference" / "api.html").read_text(encoding="utf-8")
    import topo

    missing = [name for name in topo.__all__ if name != "__version__" and f'id="topo.{name}"' not in api]
    assert not missing, f"reference/api.md documents no {missing}"
    print(f"sphinx build: {time.monotonic() - start:.1f}s")


def test_generated_parts_are_current():
    assert topo_docs.stale_pages() == [], "run: python docs/_ext/topo_docs.py"


def test_every_schema_key_is_in_the_reference():
    text = (ROOT / "docs" / "reference" / "spec.md").read_text(encoding="utf-8")
    schema = topo_docs.load_schema()
    for key in schema["properties"]["launch"]["properties"]:
        assert f"`launch.{key}`" in text
    for key in ("env.options.model_cache", "assignment.blocks[].task", "placement.resources.cpus"):
        assert f"`{key}`" in text


# the schema's `default` annotations (shown in the reference) against what topo fills in (topo/compiler/spec.py)
MINIMAL = {"version": 1, "env": {"backend": "toy"}, "topology": {"subcollectors": 1, "workers_per_subcollector": 2}}
FILLED = {
    "name": lambda s: s.name,
    "env.kwargs": lambda s: s.env_kwargs,
    "env.transforms": lambda s: list(s.transforms),
    "env.transforms_at": lambda s: s.transforms_at,
    "topology.start_method.subcollectors": lambda s: s.start_subcollectors,
    "topology.start_method.workers": lambda s: s.start_workers,
    "topology.start_method.preload": lambda s: s.preload,
    "assignment.groups.size": lambda s: s.groups.size,
    "assignment.groups.parallel_repeats": lambda s: s.groups.parallel_repeats,
    "assignment.init_states.mode": lambda s: s.init_state_mode,
    "assignment.init_states.id": lambda s: s.init_state_id,
    "assignment.seeds.base": lambda s: s.seed_base,
    "assignment.seeds.strategy": lambda s: s.seed_strategy,
    "assignment.render_devices.numbering": lambda s: s.render_numbering,
    "assignment.render_devices.device_zero_fallback": lambda s: s.render_fallback,
    "collector.mode": lambda s: s.mode,
    "collector.sync": lambda s: s.sync,
    "collector.total_frames": lambda s: s.total_frames,
    "launch.startup_timeout": lambda s: s.startup_timeout,
    "launch.shutdown_timeout": lambda s: s.shutdown_timeout,
    "launch.max_concurrent_starts": lambda s: s.max_concurrent_starts,
    "launch.restarts.window": lambda s: s.restarts_window,
    "launch.hang_timeout": lambda s: s.hang_timeout,
    "launch.stall_timeout": lambda s: s.stall_timeout,
    "launch.on_stall": lambda s: s.on_stall,
    "launch.provenance": lambda s: s.provenance,
    "launch.record_actions": lambda s: s.record_actions,
    "launch.retain_episodes": lambda s: s.retain_episodes,
    "launch.recycle.max_rss_gb": lambda s: s.recycle.max_rss_gb,
    "launch.recycle.max_latency_drift": lambda s: s.recycle.max_latency_drift,
    "launch.recycle.max_episodes": lambda s: s.recycle.max_episodes,
    "launch.recycle.check_every": lambda s: s.recycle.check_every,
    "launch.metadata_from_workers": lambda s: s.metadata_from_workers,
    "launch.use_buffers": lambda s: s.use_buffers,
    "placement.engine": lambda s: s.placement.engine,
    "placement.address": lambda s: s.placement.address,
    "placement.runtime_env": lambda s: s.placement.runtime_env,
    "placement.run_dir": lambda s: s.placement.run_dir,
    "eval.init_states": lambda s: "all" if s.eval.init_states is None else s.eval.init_states,
    "eval.trials": lambda s: s.eval.trials,
    "eval.render_devices.numbering": lambda s: s.eval.render_numbering,
    "eval.render_devices.device_zero_fallback": lambda s: s.eval.render_fallback,
    "eval.max_episode_steps": lambda s: s.eval.max_episode_steps,
    "eval.every": lambda s: s.eval.every,
    "eval.async": lambda s: s.eval.run_async,
    "eval.busy_policy": lambda s: s.eval.busy_policy,
    "eval.exploration": lambda s: s.eval.exploration,
    "eval.policy": lambda s: s.eval.policy,
}


def _defaults(node, path=""):
    for key, child in node.get("properties", {}).items():
        full = f"{path}.{key}" if path else key
        if "default" in child:
            yield full, child["default"]
        yield from _defaults(child, full)


def test_schema_defaults_are_topos():
    from topo.compiler.spec import from_data

    data = {**MINIMAL, "assignment": {"groups": {}, "init_states": {}, "seeds": {},
                                      "render_devices": {"ids": [0]}},
            "launch": {"restarts": {"max": 1}, "recycle": {}}, "eval": {"render_devices": {"ids": [0]}}}
    spec = from_data(data)
    declared = dict(_defaults(topo_docs.load_schema()))
    for key, filled in FILLED.items():
        assert key in declared, f"{key}: no default in the schema"
        assert filled(spec) == declared[key], f"{key}: schema says {declared[key]!r}, topo fills {filled(spec)!r}"
    # the rest are filled elsewhere: the libero builder's options, the policy's and Ray's defaults
    from topo.backends.libero import OPTIONS

    for name, (default, *_rest) in OPTIONS.items():
        assert declared[f"env.options.{name}"] == default, name
    policy = from_data({**MINIMAL, "policy": {"factory": "m:f"}}).policy
    assert (declared["policy.kwargs"], declared["policy.placement"], declared["policy.weight_sync"]) == (
        policy.kwargs, policy.placement, policy.weight_sync)
    node = from_data({**MINIMAL, "placement": {"engine": "ray", "nodes": [{"name": "n"}]}}).placement.nodes[0]
    assert node.count == topo_docs.load_schema()["properties"]["placement"]["properties"]["nodes"]["items"][
        "properties"]["count"]["default"]
    assert set(declared) - set(FILLED) - {f"env.options.{n}" for n in OPTIONS} == {
        "policy.kwargs", "policy.placement", "policy.weight_sync"}


def test_block_ids_are_unique():
    ids = [b.id for b in all_blocks()]
    assert len(ids) == len(set(ids))


def test_readme_links_point_at_files():
    """README.md is not part of the Sphinx build: its relative links are checked here (docs/ links by Sphinx)."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [target for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text) if "://" not in target]
    assert links
    missing = [target for target in links if not (ROOT / target).exists()]
    assert not missing, missing
