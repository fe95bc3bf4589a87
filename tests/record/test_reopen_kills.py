"""A real recording process killed by SIGKILL after its meta.json could not be written (tokengrad.faults: a
full disk at open, then a kill at a chosen commit) leaves rows without meta.json; a Recorder re-opened there
is refused in one line, and resume_step=0 gives what an uninterrupted recording gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability import record, record_step, step_counts

from tokengrad import Recorder, faults, load_run
from tokengrad.record import RunInfo
from tokengrad.record.store import claim

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
from test_reliability import record_step
from tokengrad import Recorder
from tokengrad.record import RunInfo
with Recorder(sys.argv[1], config={"lr": 1.0}, info=RunInfo(name="r")) as rec:
    for step in range(4):
        record_step(rec, step)
"""

pytestmark = pytest.mark.subprocess


@pytest.mark.parametrize("kill", ["commit:kill@2", "commit:kill@4"])
def test_a_recorder_reopened_on_rows_a_killed_process_left_without_meta(tmp_path, kill):
    run_dir = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"], faults.ENV: f"meta:raise@1,{kill}"}
    killed = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(run_dir)], env=env, capture_output=True, text=True, timeout=600
    )
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (run_dir / "meta.json").exists() and list((run_dir / "tokens").rglob("s*.parquet"))
    # the killed process's claim is stale: broken (a warning), then the refused open leaves no claim
    with pytest.warns(RuntimeWarning, match="broke the stale claim"):
        with pytest.raises(ValueError, match=r"data file\(s\) of rank 0 but no meta.json"):
            Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r")).open()
    assert not claim.lock_path(run_dir, 0).exists()
    with pytest.warns(RuntimeWarning, match="resuming at step 0: removed"):
        rec = Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r"), resume_step=0).open()
    for step in range(4):
        record_step(rec, step)
    rec.close()
    assert not claim.lock_path(run_dir, 0).exists()
    clean = record(tmp_path / "clean", range(4))
    assert step_counts(load_run(run_dir)) == step_counts(load_run(clean))
    keys = "step, sample_id, position"
    got = load_run(run_dir).sql(f"SELECT count(*) AS n, count(DISTINCT ({keys})) AS d FROM tokens")
    assert got["n"][0] == got["d"][0] == 32  # 4 steps x 8 loss tokens, each once
    assert len(load_run(run_dir).samples) == 8
