"""``topo.collector`` in a training script (real torchrl, ToyVLAEnv, TinyVLA): the policy acts, weight
updates reach every subcollector (or the server), failures are named, and nothing the run started is left
(the trainer killed, its weights pushed: tests/launch/test_restarts.py, during a restart)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import topo
from topo.errors import UsageError

from tests import preimported
from tests.launch.launch_helpers import HANG_GUARD_S, HERE, alive, subprocess_env, toy_spec, write
from tests.launch.script_events import parse

pytestmark = pytest.mark.slow
TRAINER = HERE / "trainer.py"
ROOT = HERE.parent.parent


def train(tmp_path, *args, spec=None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    spec = spec or write(tmp_path / "toy.yaml", toy_spec(2, 2))
    done = preimported.run([sys.executable, str(TRAINER), str(spec), *map(str, args)], env=subprocess_env(),
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    events = list(parse(done.stdout))
    return done, events


def of(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


def assert_nothing_left(report: dict, t_end: float) -> None:
    p = report["processes"]
    assert p["left_behind"] == [] and p["alive_after"] == []
    pids = set(p["started"]) | {pid for pid in p["worker_pids"] + p["subcollector_pids"] if pid}
    assert alive(pids, t_end) == []


def assert_trainer_state_restored(events: list[dict]) -> None:
    (before,), (after,) = of(events, "before"), of(events, "after")
    assert after["state"] == before["state"]
    assert not set(after["state"]["topo_env"]) & {"TOPO_RUN_DIR", "TOPO_MUJOCO_GL", "TOPO_TRAINER_PID"}


@pytest.mark.parametrize("placement", ["subcollector", "server"])
def test_the_policy_acts_with_the_weights_the_trainer_pushed(tmp_path, placement):
    """Every row of a batch carries the version last pushed, and the copies act as the trainer's copy does; an
    optimizer step is not seen until update_weights (the first one is skipped): no copy shares the trainer's
    parameters. The subcollector placement runs the default weight sync, shared_mem."""
    done, events = train(tmp_path, "--placement", placement, "--then", "skip-first-update", "--iterations", 4)
    t_end = time.time()
    assert done.returncode == 0, done.stderr
    batches = of(events, "batch")
    assert [b["versions"] for b in batches] == [[0], [0], [1], [2]]  # every row of batch i: the update pushed before it
    assert all(b["shape"][:2] == [2, 2] for b in batches)  # sync: 2 subcollectors x 2 workers
    assert batches[1]["diff"] > 1e-3  # the trainer stepped; the copies still act with version 0
    assert max(b["diff"] for i, b in enumerate(batches) if i != 1) < 1e-5  # pushed: the trainer's copy computes the same
    assert [u["version"] for u in of(events, "update")] == [1, 2, 3]
    memory = batches[0]["memory"]  # each worker's own figures, read by the trainer between batches
    assert [(m["subcollector"], m["worker"], m["global_index"]) for m in memory] == [(0, 0, 0), (0, 1, 1), (1, 0, 2),
                                                                                    (1, 1, 3)]
    assert all(0 < m["rss_mb"] <= m["peak_rss_mb"] < 4096 for m in memory), memory
    report = of(events, "after")[0]["report"]
    assert report["ok"]
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    policy = report["policy"]
    assert (policy["placement"], policy["updates"], policy["trainer_policy"]) == (placement, 3, True)
    assert [e["policy_versions"] for e in report["first_batch"]] == [[2], [2]]  # each subcollector's last batch
    assert [e["status"] for e in report["first_batch"]] == ["ok", "ok"]
    assert (report["processes"]["server_pid"] is not None) == (placement == "server")
    assert report["env_closes"] == {"constructed": 4, "closed": 4}
    assert [m["pid"] for m in memory] == report["processes"]["worker_pids"]  # the workers' own, not a parent's
    assert report["memory"]["measured"] == 4 and report["memory"]["peak_rss_mb"]["max"] >= max(
        m["peak_rss_mb"] for m in memory)  # read again at close: the peak of each worker's whole life
    assert_nothing_left(report, t_end)
    assert_trainer_state_restored(events)


def test_on_a_torchrl_without_the_restart_names_training_runs_with_restarts_off(tmp_path):
    """torchrl's own collectors and a synchronous weight-sync scheme, the restarts asked for turned off, said so."""
    done, events = train(tmp_path, "--iterations", 2, "--restarts", 2, "--torchrl-without-restarts")
    t_end = time.time()
    assert done.returncode == 0, done.stderr
    assert [b["versions"] for b in of(events, "batch")] == [[0], [1]]
    assert "warning: torchrl 0.14.1: restarts and subcollector hang detection are off" in done.stderr
    report = of(events, "after")[0]["report"]
    assert report["ok"] and report["torchrl"]["features"]["restarts"] is False
    assert report["torchrl"]["warnings"] == [
        "torchrl 0.14.1: restarts and subcollector hang detection are off (a failure ends the run): missing "
        "torchrl.collectors._multi_base._make_process_no_warn_cls"]
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 4}
    assert report["env_closes"] == {"constructed": 4, "closed": 4}
    assert_nothing_left(report, t_end)


@pytest.fixture(scope="module")
def multiprocess_run(tmp_path_factory):
    """One run, toy 2 x 2, the multiprocess weight-sync scheme: the first update skipped, the second pushed, and the
    loop's own exception raised after the third batch; read by the two tests below."""
    tmp_path = tmp_path_factory.mktemp("multiprocess")
    report_dir = tmp_path / "report"
    done, events = train(tmp_path, "--weight-sync", "multiprocess", "--then", "skip-first-update", "--iterations", 3,
                         "--raise-at", 2, "--report", report_dir)
    return done, events, report_dir, time.time()


def test_multiprocess_weight_sync_reaches_every_subcollector_with_pushed_weights_only(multiprocess_run):
    """The multiprocess scheme: an optimizer step is not seen until update_weights, then every row acts with it
    (shared_mem, the default: test_the_policy_acts_with_the_weights_the_trainer_pushed)."""
    done, events, _, _ = multiprocess_run
    assert done.returncode == 0, done.stderr
    batches = of(events, "batch")
    assert [b["versions"] for b in batches] == [[0], [0], [1]]  # batch 2: every row of every subcollector at 1
    assert batches[0]["diff"] < 1e-5
    assert batches[1]["diff"] > 1e-3  # the trainer stepped; the copies still act with version 0
    assert batches[2]["diff"] < 1e-5  # pushed: they act with the trainer's weights again


def test_an_exception_in_the_loop_tears_down_and_still_writes_the_report(multiprocess_run):
    """The loop raises after its third batch, in the run the multiprocess weight-sync test reads (one launch for both:
    the loop's failure and the teardown are not per subcollector; here they end a run whose weights were pushed)."""
    done, events, report_dir, t_end = multiprocess_run
    assert done.returncode == 0, done.stderr
    assert of(events, "loop-error")[0]["message"] == "the training step failed"  # the loop's own exception
    report = json.loads((report_dir / "summary.json").read_text())
    assert not report["ok"] and report["error"]["type"] == "TrainingStepFailed" and report["error"]["in"] == "training loop"
    assert report["env_closes"] == {"constructed": 4, "closed": 4}  # a clean shutdown, envs closed
    assert_nothing_left(report, t_end)
    assert_trainer_state_restored(events)


def test_a_worker_killed_mid_training_is_named_with_its_plan_row(tmp_path):
    done, events = train(tmp_path, "--then", "kill-worker", "--iterations", 50)
    t_end = time.time()
    assert done.returncode == 0, done.stderr
    (err,) = of(events, "launch-error")
    assert (err["subcollector"], err["worker"], err["row"]["global_index"]) == (1, 1, 3)
    assert "env worker died while collecting without a traceback (killed by SIGKILL" in err["message"]
    report = of(events, "after")[0]["report"]
    assert report["error"]["failure"]["kind"] == "worker-died"
    assert_nothing_left(report, t_end)
    assert_trainer_state_restored(events)


def test_a_subcollector_killed_while_collecting_is_named_and_a_weight_update_never_waits_on_it(tmp_path):
    """Subcollector 0 SIGKILLed after the first batch: the run fails naming it and its pid (what `topo launch`
    prints: exit code 1, "at subcollector 0"), everything is torn down; and the weight update in flight does
    not wait for its ack (torchrl's shared-memory scheme waits for every subcollector's, without a timeout)."""
    started = time.monotonic()
    done, events = train(tmp_path, "--then", "kill-subcollector-then-update", "--iterations", 5)
    took = time.monotonic() - started
    t_end = time.time()
    assert done.returncode == 0, done.stderr
    (killed,) = of(events, "killed")
    (err,) = of(events, "launch-error")
    assert err["subcollector"] == 0 and err["worker"] is None and err["exit_code"] == 1
    assert f"subcollector process ended unexpectedly (killed by SIGKILL, pid {killed['pid']})" in err["message"]
    assert "  at subcollector 0" in err["formatted"].splitlines()
    assert of(events, "update") == []  # the update in flight was interrupted, not completed
    assert took < HANG_GUARD_S / 2
    report = of(events, "after")[0]["report"]
    assert report["error"]["failure"]["kind"] == "subcollector-died"
    assert_nothing_left(report, t_end)
    assert_trainer_state_restored(events)


def test_the_grpo_example_trains_on_the_toy_topology(tmp_path):
    """Its length (31 s beside two CPU hogs): the example's run of 2 x 3 workers over three iterations, started and torn
    down."""
    done = preimported.run([sys.executable, str(ROOT / "examples" / "train_grpo.py"), str(ROOT / "examples" / "toy_2x3.yaml"),
                           "--iterations", "3", "--report", str(tmp_path / "report")], env=subprocess_env(),
                           capture_output=True, text=True, timeout=HANG_GUARD_S, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("iteration")]
    assert [line.split("acted with weights ")[1].split(",")[0] for line in lines] == ["v[0]", "v[1]", "v[2]"]
    report = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert report["ok"] and report["policy"]["updates"] == 3
    assert report["constructions"]["by_role"] == {"trainer": 0, "server": 0, "subcollector": 0, "worker": 6}


def test_the_quickstart_runs_as_written():
    """examples/quickstart.py, the README's five lines, from the repository root as the README says."""
    done = preimported.run([sys.executable, "examples/quickstart.py"], env=subprocess_env(), capture_output=True,
                           text=True, timeout=HANG_GUARD_S, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stdout.splitlines()]
    assert lines[0].startswith("run ok: 2 subcollector(s), 6 env workers, batches per subcollector [3, 3]"), done.stdout
    assert "env constructions: trainer 0, server 0, subcollector 0, worker 6 (expected worker 6, others 0)" in lines
    assert "left behind 0, alive after 0" in lines
    assert any(line.endswith("3 update(s); versions in each subcollector's last batch [[2], [2]]") for line in lines)


def test_collector_arguments_that_would_break_a_guarantee_are_refused(tmp_path, monkeypatch):
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from topo.launch.ray.engine import RayEngine

    plan = topo.compile_spec(str(write(tmp_path / "toy.yaml", toy_spec(1, 2))))
    with pytest.raises(UsageError, match="build subcollector 0's envs in the trainer"):
        topo.collector(plan, replay_buffer=TensorDictReplayBuffer(storage=LazyTensorStorage(100)))
    with pytest.raises(UsageError, match="frames_per_batch"):
        topo.collector(plan, frames_per_batch=10)
    with pytest.raises(UsageError, match="policy= needs a policy factory"):
        topo.collector(plan, policy=object())
    ray_plan = topo.compile_spec(str(write(tmp_path / "ray.yaml", toy_spec(1, 2, placement={"engine": "ray"}))))
    # an engine that cannot push weights
    monkeypatch.setattr(RayEngine, "__init__", lambda self, restarts=True: setattr(self, "capabilities", frozenset()))
    with pytest.raises(UsageError, match="placement.engine ray cannot push weights"):
        topo.collector(ray_plan, policy_factory="topo.policies.tinyvla:make", policy=object())
