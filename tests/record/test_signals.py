"""Ctrl-C and SIGTERM: the step in flight is discarded, completed steps are flushed, the status is written,
the exit is one line, and a resume afterwards reads every step once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_kills import CONFIG, assert_each_step_once, train
from test_reliability import record_step

from tokengrad import Recorder, faults, load_run
from tokengrad.record import RunInfo


def test_an_interrupted_step_is_discarded_and_the_status_counts_the_steps_before_it(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with Recorder(tmp_path / "r", config={}, info=RunInfo(name="r")) as rec:
            for step in range(2):
                record_step(rec, step)
            with rec.step(2) as st:
                lp = torch.full((2, 3), -1.0, requires_grad=True)
                st.track(lp, token_ids=torch.zeros(2, 3, dtype=torch.long))
                raise KeyboardInterrupt  # Ctrl-C half way through step 2
    run = load_run(tmp_path / "r")
    assert run.steps["step"].tolist() == [0, 1] and run.steps["loss"].notna().all()
    assert run.sql("SELECT max(step) AS m FROM tokens")["m"][0] == 1
    assert run.rank_status[0]["last_step"] == 1 and run.meta["finished"] is False
    assert lp.grad is None and not lp._backward_hooks  # the step's hook was removed


def test_another_error_in_a_step_still_records_it_as_far_as_it_got(tmp_path):
    with pytest.raises(RuntimeError):
        with Recorder(tmp_path / "r", config={}, info=RunInfo(name="r")) as rec:
            with rec.step(0) as st:
                st.log(loss=1.0)
                raise RuntimeError("out of memory")
    assert load_run(tmp_path / "r").steps["loss"].tolist() == [1.0]


@pytest.mark.subprocess
@pytest.mark.parametrize("sig, rc", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_flushes_a_lagging_writer_and_the_run_resumes_exactly(tmp_path, sig, rc):
    run_dir = tmp_path / "run"
    config = tmp_path / "tiny.toml"
    # 24 steps: a loaded machine can train 8 tiny steps before the slow writer has committed two
    config.write_text(CONFIG.format(steps=24))
    env = {**os.environ, faults.ENV: "commit:sleep=0.4"}  # a slow disk
    cmd = [sys.executable, "-m", "tokengrad.cli", "train", str(config), f"run_dir={run_dir}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and len(list((run_dir / "steps").rglob("s*.parquet"))) < 2:
        time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == rc, err[-2000:]
    assert "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(f"tokengrad train: stopped by {sig.name.replace('SIGINT', 'Ctrl-C')}")
    )
    run = load_run(run_dir)
    last = run.rank_status[0]["last_step"]
    assert run.steps["step"].tolist() == list(range(last + 1))  # every completed step, none in flight
    assert run.steps["loss"].notna().all() and run.meta["finished"] is False
    done = train(tmp_path, run_dir, "--resume", steps=24)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_each_step_once(run_dir, 24)
