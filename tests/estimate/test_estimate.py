"""``topo plan --estimate`` on the toy backend with its real probe: one child process builds the worker (the
calling process builds none), the second call reads the cache, a refusal exits 2 and ``--force`` 0."""
from __future__ import annotations

import json
import os

from click.testing import CliRunner

from topo.cli import main
from topo.estimate import cache
from topo.estimate.model import HOST
from tests.compiler.compiler_helpers import spec_text, toy


def test_the_probe_runs_in_a_child_and_is_cached(tmp_path, monkeypatch):
    import topo.worker

    monkeypatch.setenv(cache.CACHE_VAR, str(tmp_path / "estimates"))
    built = []
    monkeypatch.setattr(topo.worker, "make_env", lambda **kwargs: built.append(kwargs))  # this process's only
    spec = tmp_path / "spec.yaml"
    data = toy(1, 4)
    data["policy"] = {"factory": "topo.policies.tinyvla:make", "kwargs": {"action_dim": 4, "image_size": 16,
                                                                          "state_dim": 8}}
    spec.write_text(spec_text(data))

    first = CliRunner().invoke(main, ["plan", str(spec), "--estimate", "--format", "json"])
    assert first.exit_code == 0, first.output
    out = json.loads(first.stdout)
    result = out["probe"]["result"]
    assert out["probe"]["source"] == "measured now" and built == [] and result["pid"] != os.getpid()
    assert result["forked"] is True  # forked from a process that imported the forkserver's preload, as in a launch
    assert result["steps"]["count"] == 30 and result["policy"]["batch"] == 4 and result["policy"]["param_bytes"] > 0
    assert 0.1 < out["footprint_gb"]["worker_gb"] < 2 and out["frames_per_s"]["sync"] > 0 and out["ready"]["s"] > 0
    # the data plane, from forked echo workers: a toy's 4-worker round pays it 4 times, serially
    assert result["plane"]["workers"] == 2 and result["plane"]["wall_s"] > 0
    assert out["frames_per_s"]["sync"] <= 4 / (4 * result["plane"]["wall_s"])

    monkeypatch.setattr("topo.estimate.probe.run", lambda request: (_ for _ in ()).throw(AssertionError("probed")))
    second = CliRunner().invoke(main, ["plan", str(spec), "--estimate"])
    assert second.exit_code == 0, second.output
    assert "probe cached" in second.output and f"memory on {HOST}: 4 workers x" in second.output

    monkeypatch.setattr("topo.estimate.host.available_gb", lambda: 1.0)
    refused = CliRunner().invoke(main, ["plan", str(spec), "--estimate"])
    assert refused.exit_code == 2 and "error memory-exceeds-node" in refused.output
    assert "GB usable (90%); not even 1 x 1 fits" in refused.output
    assert CliRunner().invoke(main, ["plan", str(spec), "--estimate", "--force"]).exit_code == 0
