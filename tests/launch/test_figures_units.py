"""The run's figures in torchrl's CSV logger (:mod:`topo.launch.figures`), read back from its files, on a fabricated
run directory (no process started)."""
from __future__ import annotations

import json
import os

from torchrl.record.loggers import CSVLogger

from topo.runtime import heartbeat
from topo.launch.figures import Figures

from tests.launch.test_live_units import NOW, fabricated, slots


def scalars(log_dir, name: str) -> list[tuple[int, float]]:
    path = os.path.join(log_dir, "run", "scalars", "topo", name + ".csv")
    with open(path) as f:
        return [(int(step), float(value)) for step, value in (line.strip().split(",") for line in f)]


def test_each_reading_and_each_evaluation_round_is_logged(tmp_path):
    path = fabricated(tmp_path)
    logger = CSVLogger("run", log_dir=str(tmp_path / "logs"))
    figures = Figures(logger, path)
    figures.log(NOW)
    observed = os.path.join(path, "observed")
    (sub0,) = [f for f in os.listdir(observed) if f.startswith("sub0")]
    record = json.load(open(os.path.join(observed, sub0)))
    with open(os.path.join(observed, sub0), "w") as f:
        json.dump({**record, "batches": 14, "policy_versions": [4]}, f)  # four batches more, in 2 s
    os.makedirs(os.path.join(path, "eval"))
    with open(os.path.join(path, "eval", "round-001.json"), "w") as f:
        json.dump({"round": 1, "policy_version": 4, "success_rate": 0.5, "ci95": [0.2, 0.8], "seconds": 3.0,
                   "tasks": [{"task_id": 0, "success_rate": 1.0}, {"task_id": 1, "success_rate": 0.0}]}, f)
    slots(heartbeat.path(path, 0, 0), [(990.0, 985.0, 0, 0, 0, 0, 0, 0.0, 0.0, 0),
                                       (1001.5, 1001.4, 999.0, 1, 500 * 2**20, 0, 118, 0.1, 0.1, 2),
                                       (900.0, 899.9, 899.0, 1, 200 * 2**20, 0, 40, 0.1, 0.1, 1)])
    figures.log(NOW + 2)
    logs = tmp_path / "logs"
    # at step = frames (4 per subcollector batch); sync: the collector's batches wait for subcollector 1's sixth
    assert scalars(logs, "batches") == [(60, 5.0), (76, 5.0)]
    assert scalars(logs, "recycles") == [(60, 1.0), (76, 1.0)] and scalars(logs, "policy_version")[-1] == (76, 4.0)
    assert scalars(logs, "batch_s") == [(76, 1.0)]  # 2 s for two batches of each of the 2 subcollectors
    assert scalars(logs, "frames_per_s")[-1] == (76, 8.0)
    assert scalars(logs, "rss_mb_max") == [(60, 950.0), (76, 950.0)] and scalars(logs, "rss_mb_mean")[-1][1] == 437.5
    assert scalars(logs, "workers_attention") == [(60, 3.0), (76, 3.0)]
    assert scalars(logs, "eval/success_rate") == [(4, 0.5)]
    assert scalars(logs, "eval/success_rate_ci_low") == [(4, 0.2)]
    assert scalars(logs, "eval/task_1/success_rate") == [(4, 0.0)]
    figures.close()  # its last reading: the round is not logged again
    assert scalars(logs, "eval/success_rate") == [(4, 0.5)] and len(scalars(logs, "batches")) == 3
