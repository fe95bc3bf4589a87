"""Real `tokengrad train` processes killed or starved at chosen moments (tokengrad.faults), then resumed:
no step lost or read twice, a full disk ends with exit 0 and the exact count of lost rows."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tokengrad import faults, load_run
from tokengrad.train.checkpoint import load_trainer_state

REPO = Path(__file__).resolve().parents[2]
CONFIG = """model = "tiny"
task = "arithmetic"
steps = {steps}
prompts_per_step = 2
group_size = 2
max_new_tokens = 8
bf16 = false
progress = false
eval_every = 0
checkpoint_every = 1
"""

pytestmark = pytest.mark.subprocess


def train(tmp_path, run_dir, *extra, fault: str | None = None, steps: int = 3):
    config = tmp_path / "tiny.toml"
    config.write_text(CONFIG.format(steps=steps))
    env = {**os.environ, "PYTHONPATH": os.environ["PYTHONPATH"]}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
    cmd = [sys.executable, "-m", "tokengrad.cli", "train", str(config), f"run_dir={run_dir}", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


def assert_each_step_once(run_dir, steps: int) -> None:
    run = load_run(run_dir)
    assert run.steps["step"].tolist() == list(range(steps))
    keys = "step, pass_id, sample_id, position"
    got = run.sql(
        f"SELECT count(*) AS n, count(DISTINCT ({keys})) AS d, count(DISTINCT step) AS s FROM tokens"
    )
    assert got["n"][0] == got["d"][0] and got["s"][0] == steps
    assert run.samples.groupby("step").size().tolist() == [4] * steps  # 2 prompts x 2 completions


def test_a_checkpoint_never_gets_ahead_of_the_data(tmp_path):
    """A slow disk (every commit waits 1 s) and a kill right after the first checkpoint: the checkpoint
    says step 0, so step 0's rows must be on disk, and the resumed run holds every step once."""
    run_dir = tmp_path / "run"
    killed = train(tmp_path, run_dir, fault="commit:sleep=1,checkpoint_saved:kill@1")
    assert killed.returncode == -9, killed.stderr[-2000:]
    state = load_trainer_state(run_dir)
    assert state["step"] == 0 and state["data_step"] == 0
    assert load_run(run_dir).steps["step"].tolist() == [0]
    resumed = train(tmp_path, run_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_each_step_once(run_dir, 3)


def test_a_disk_full_until_the_end_exits_0_with_the_exact_count(tmp_path):
    run_dir = tmp_path / "run"
    done = train(tmp_path, run_dir, fault="write:raise,checkpoint_write:raise", steps=2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "the checkpoint after step 0 could not be written" in done.stderr
    n = int(re.search(r"tokengrad: (\d+) rows could not be written", done.stderr).group(1))
    run = load_run(run_dir)
    assert n > 0 and run.rows_dropped == n and sum(run.meta["rows_dropped"].values()) == n
    assert run.steps.empty and run.meta["finished"] is True


def test_a_read_only_run_directory_exits_0(tmp_path):
    run_dir = tmp_path / "run"
    done = train(tmp_path, run_dir, fault="write:raise,checkpoint_write:raise,meta:raise", steps=2)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert re.search(r"\d+ rows could not be written .*could not be saved either", done.stderr)


def test_a_kill_in_the_final_compaction_is_finished_by_a_resume(tmp_path):
    """Killed while merging its files after the last step: the checkpoint is at the last step and the run
    is not finished; --resume trains nothing, tidies the files and marks it finished."""
    run_dir = tmp_path / "run"
    killed = train(tmp_path, run_dir, fault="compacted:kill@1", steps=3)
    assert killed.returncode == -signal.SIGKILL
    assert load_run(run_dir).meta["finished"] is False
    done = train(tmp_path, run_dir, "--resume", steps=3)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "stopped after its last step 2; finishing it" in done.stderr
    assert load_run(run_dir).meta["finished"] is True
    assert_each_step_once(run_dir, 3)
