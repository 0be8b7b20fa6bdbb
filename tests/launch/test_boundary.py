"""The torchrl boundary (topo.launch.boundary): every private name topo uses is present in the installed
torchrl, and a torchrl that lacks one is refused before anything starts, or runs with the feature off and a
warning where that is safe. No process is started here."""
from __future__ import annotations

import subprocess
import sys

import pytest

from topo import compile_spec
from topo.checks import FAIL, OK, WARN
from topo.doctor.host import check_torchrl
from topo.errors import LaunchError
from topo.launch import boundary
from topo.launch.boundary import NAMES, Name, Support

from tests.launch.launch_helpers import toy_spec, write


@pytest.mark.parametrize("name", NAMES, ids=lambda n: f"{n.feature}:{n.module}.{n.attr}:{n.kind}")
def test_every_name_topo_uses_is_in_the_installed_torchrl(name):
    assert boundary._present(name), f"{name.label} ({name.why}) is gone from torchrl {boundary.installed_version()}"


def test_the_installed_torchrl_is_tested_and_supports_every_feature():
    support = boundary.check()
    assert support.error is None and support.missing == {}
    assert support.tested is not None, f"torchrl {support.version} is not in boundary.TESTED"
    assert support.warnings() == [] and support.refusal(boundary.FEATURES) is None


GONE = Name("restarts", "torchrl.collectors._multi_base", "_no_such_process_factory", "test")
GONE_TEXT = Name("restarts", "torchrl.collectors._runner", "_main_async_collector_impl", "test", kind="source",
                 members=('"no-such-message"',))
GONE_ATTR = Name("restarts", "torchrl.weight_update", "SharedMemWeightSyncScheme", "test", kind="instance",
                 members=("_no_such_queues",))


@pytest.mark.parametrize("name", [GONE, GONE_TEXT, GONE_ATTR], ids=["name", "wire-format", "instance-attribute"])
def test_a_missing_name_of_each_kind_is_found(name):
    support = boundary.check(("restarts",), names=(name,))
    assert not support.ok("restarts") and support.missing == {"restarts": [name.label]}
    assert support.ok("collector")


def plan_with(tmp_path, **launch) -> dict:
    spec = toy_spec(1, 2)
    spec["launch"] = {**spec.get("launch", {}), **launch}
    return compile_spec(str(write(tmp_path / "toy.yaml", spec)))


def missing(feature: str, monkeypatch, version: str = "0.14.1") -> None:
    support = Support(version, boundary.TESTED.get(version), {feature: [f"torchrl.x.{feature}_gone"]})
    monkeypatch.setattr(boundary, "support", lambda features: support)


def test_restarts_are_dropped_with_a_warning_when_their_names_are_missing(tmp_path, monkeypatch, capsys):
    from topo.launch.run import Run

    plan = plan_with(tmp_path, restarts={"max": 2, "window": None}, hang_timeout=30)
    assert "restarts" in boundary.features_of(plan, None)
    missing("restarts", monkeypatch)
    run = Run(plan, progress=False)
    assert "restarts" not in run.engine.capabilities and "collector_acks" not in run.engine.capabilities
    (warning,) = run.wiring.torchrl.warnings(run.wiring.features)
    assert warning == ("torchrl 0.14.1: restarts and subcollector hang detection are off (a failure ends the run): "
                       "missing torchrl.x.restarts_gone")
    monkeypatch.undo()  # the installed torchrl has them
    assert Run(plan, progress=False).engine.capabilities >= {"restarts", "collector_acks"}


def test_a_missing_collector_name_refuses_the_run_before_anything_starts(tmp_path, monkeypatch):
    from topo.launch.run import Run

    missing("collector", monkeypatch, version="0.16.0")
    with pytest.raises(LaunchError, match=r"torchrl 0.16.0 lacks names topo needs \(collector: torchrl.x.collector_gone\)"):
        Run(plan_with(tmp_path), progress=False)


def test_an_old_torchrl_is_refused_and_an_untested_one_warned(monkeypatch):
    import torchrl

    monkeypatch.setattr(torchrl, "__version__", "0.13.2")
    old = boundary.check(())
    assert old.error.startswith("torchrl 0.13.2 is older than topo supports (0.14 or newer")
    assert old.refusal(("collector",)) == old.error
    monkeypatch.setattr(torchrl, "__version__", "0.16.0")
    new = boundary.check(())
    assert new.error is None and new.tested is None
    assert new.warnings(()) == ["torchrl 0.16.0 is not among the versions topo was tested with "
                                f"({', '.join(boundary.TESTED)}); every name it needs was found"]


def test_doctor_reports_the_verdict():
    ok = check_torchrl(Support("0.14.1", "the full suite").to_dict(("collector",)), ("collector",))
    assert ok.status == OK and ok.detail.startswith("torchrl 0.14.1 (tested: the full suite)")
    gone = Support("0.16.0", None, {"collector": ["torchrl.collectors.MultiSyncCollector"]})
    assert check_torchrl(gone.to_dict(), ("collector",)).status == FAIL
    dropped = Support("0.14.1", "the full suite", {"restarts": ["a.b"]})
    assert check_torchrl(dropped.to_dict(), ("collector", "restarts")).status == WARN


def test_the_boundary_imports_no_torch():
    code = "import sys, topo.launch.boundary as b; b.features_of; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_pause_waiting_after_a_rollout_is_held_back_until_the_loops_next_poll():
    """torchrl's loop polls for _MIN_TIMEOUT after each rollout and drops it when a message waits: a pause is held
    back from that poll (the rollout goes to the buffer) and given at the next one; other messages are not."""
    import multiprocessing

    from torchrl.collectors._constants import _MIN_TIMEOUT

    parent, child = multiprocessing.Pipe()
    pipe = boundary.KeepingPipe(child)
    assert pipe.poll(_MIN_TIMEOUT) is False  # nothing waits
    parent.send((None, "pause"))
    assert pipe.poll(_MIN_TIMEOUT) is False  # after the rollout: kept
    assert pipe.poll(1e-4) is True and pipe.recv() == (None, "pause")  # at the loop's top: paused
    assert pipe.poll(1e-4) is False
    parent.send((None, "update"))
    assert pipe.poll(_MIN_TIMEOUT) is True and pipe.recv() == (None, "update")  # the rollout dropped, as torchrl does
    parent.send((None, "restart"))
    assert pipe.poll(1e-2) is True and pipe.recv() == (None, "restart")
    pipe.send(("j", "updated"))  # the pipe's other methods are the pipe's
    assert parent.recv() == ("j", "updated")
