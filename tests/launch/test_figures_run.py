"""The run's figures in torchrl's CSV logger on a real toy run (1 x 2 workers, the training API): the files hold
the figures at growing frame counts, the last one the run's."""
from __future__ import annotations

import sys

import pytest

import topo

from tests import preimported
from tests.launch.launch_helpers import HANG_GUARD_S, subprocess_env, toy_spec, write

pytestmark = pytest.mark.slow
SCRIPT = """
import sys
from torchrl.record.loggers import CSVLogger
import topo

if __name__ == "__main__":
    spec, logs = sys.argv[1:]
    with topo.collector(spec, logger=CSVLogger("run", log_dir=logs), progress=False) as run:
        run.life.figures.every_s = 0.2
        for i, batch in enumerate(run.collector):
            if i == 30:
                break
    print(run.report.data["ok"])
"""


def test_a_training_loop_logs_the_runs_figures_to_csv(tmp_path):
    spec = write(tmp_path / "toy.yaml", toy_spec(1, 2))
    (tmp_path / "train.py").write_text(SCRIPT)
    done = preimported.run([sys.executable, str(tmp_path / "train.py"), str(spec), str(tmp_path / "logs")],
                           env=subprocess_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0 and done.stdout.split() == ["True"], done.stderr
    folder = tmp_path / "logs" / "run" / "scalars" / "topo"
    frames = topo.compile_spec(str(spec))["collector"]["frames_per_batch"]
    batches = [tuple(map(float, line.split(","))) for line in (folder / "batches.csv").read_text().splitlines()]
    assert batches[-1][1] >= 31 and batches[-1][0] == batches[-1][1] * frames  # the last reading, at step = frames
    steps = [step for step, _ in batches]
    assert steps == sorted(steps) and len(batches) >= 1
    assert {"frames_per_s.csv", "rss_mb_max.csv", "restarts.csv", "step_rate_mean.csv"} <= {p.name for p in folder.iterdir()}
    assert float((folder / "restarts.csv").read_text().splitlines()[-1].split(",")[1]) == 0.0
