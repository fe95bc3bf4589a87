"""Run status (tokengrad.read.status): finished, crashed (the loop raised), stopped (the recording process is
gone: known from its claim on this host, else presumed after STALE_S without a write), running; and
`tokengrad watch` ending on a stopped run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from synthetic_runs import write_meta, write_synthetic_run

from tokengrad.cli import main
from tokengrad.read import claim_file
from tokengrad.read.status import STALE_S, STATES, run_status


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def claim_of(run, **fields) -> None:
    """ranks/rank000.lock as the process `fields` name (default: this one) would leave it."""
    path = claim_file.lock_path(run, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**claim_file.this_process(), **fields}))


def test_finished_running_crashed_and_quiet_runs(tmp_path):
    done = write_synthetic_run(tmp_path / "done", n_steps=2, seed=0)
    assert run_status(done).state == "finished"
    live = tmp_path / "live"
    live.mkdir()
    write_meta(live, "live", 2, 0, finished=False)  # opened, no step yet, no claim (an older tokengrad)
    s = run_status(live)
    assert (s.state, s.steps_seen) == ("running", False)
    s = run_status(live, now=time.time() + STALE_S + 60)  # never closed, gone quiet
    assert s.state == "stopped" and "no file written for 16 min" in s.why
    raised = write_synthetic_run(tmp_path / "raised", n_steps=2, seed=1)
    write_meta(raised, "raised", 2, 0, finished=False)
    (raised / "ranks").mkdir(exist_ok=True)
    (raised / "ranks" / "rank000.json").write_text(json.dumps({"rank": 0, "finished": False}))
    s = run_status(raised)
    assert (s.state, s.steps_seen) == ("crashed", True) and "raised" in s.why
    old = time.time() - 3600
    for p in live.rglob("*"):
        os.utime(p, (old, old))
    assert run_status(live).state == "stopped"
    assert set(STATES) == {"running", "finished", "crashed", "stopped"}


def test_a_claim_of_a_gone_process_stops_the_run_at_once(tmp_path):
    run = write_synthetic_run(tmp_path / "r", n_steps=7, seed=0)
    write_meta(run, "r", 7, 2, finished=False)
    pid = dead_pid()
    claim_of(run, pid=pid)
    s = run_status(run)  # files written a moment ago: the clock alone would say running
    assert s.state == "stopped" and s.last_step == 6
    assert s.why == f"the recording process (pid {pid}) is gone: killed or crashed; last committed step 6"
    claim_of(run, pid=os.getppid(), boot_id="an-earlier-boot")
    assert "the machine restarted" in run_status(run).why
    claim_of(run, pid=os.getppid(), proc_start=1)  # the pid now names another process
    assert run_status(run).state == "stopped"


def test_watch_ends_on_a_stopped_or_crashed_run_with_one_line(tmp_path, capsys):
    run = write_synthetic_run(tmp_path / "r", n_steps=3, seed=0)
    write_meta(run, "r", 3, 2, finished=False)
    claim_of(run, pid=dead_pid())
    assert main(["watch", str(run), "--interval", "0.1"]) == 3
    assert capsys.readouterr().err.splitlines() == [f"tokengrad watch: {run} stopped: {run_status(run).why}"]
    claim_file.lock_path(run, 0).unlink()
    (run / "ranks" / "rank000.json").write_text(json.dumps({"rank": 0, "finished": False}))
    assert main(["watch", str(run), "--interval", "0.1"]) == 3
    assert "crashed: the training loop raised" in capsys.readouterr().err


def test_an_empty_run_whose_process_died_is_stopped_not_waiting(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    write_meta(run, "empty", 2, 0, finished=False)
    claim_of(run, pid=dead_pid())
    s = run_status(run)
    assert (s.state, s.steps_seen, s.last_step) == ("stopped", False, None)
    assert s.why.endswith("no step was committed")


def test_a_live_process_keeps_a_quiet_run_running(tmp_path):
    run = tmp_path / "slow"
    run.mkdir()
    write_meta(run, "slow", 2, 0, finished=False)
    claim_of(run)  # this very process records it
    s = run_status(run, now=time.time() + 10 * STALE_S)  # a long step: nothing written for hours
    assert s.state == "running" and f"(pid {os.getpid()}) runs" in s.why


def test_another_hosts_claim_or_an_unusable_one_falls_back_to_the_clock(tmp_path):
    run = tmp_path / "shared"
    run.mkdir()
    write_meta(run, "shared", 2, 0, finished=False)
    for text in (json.dumps({**claim_file.this_process(), "host": "node-17"}), "", "[1]", "x" * 70_000):
        claim_file.lock_path(run, 0).parent.mkdir(exist_ok=True)
        claim_file.lock_path(run, 0).write_text(text)
        assert run_status(run).state == "running"
        assert run_status(run, now=time.time() + STALE_S + 60).state == "stopped"


def test_a_meta_file_linking_out_of_the_run_is_not_read(tmp_path):
    private = write_synthetic_run(tmp_path / "private", n_steps=1, seed=0)  # finished
    run = tmp_path / "served" / "r"
    run.mkdir(parents=True)
    (run / "meta.json").symlink_to(private / "meta.json")
    from tokengrad import load_run
    from tokengrad.read.meta_file import MetaError

    with pytest.raises(MetaError, match="links outside the run folder"):
        load_run(run)
    assert load_run(run, follow_links_out=True).meta["run_name"]
    assert run_status(run).state != "finished"  # the private run's meta.json is not read either
    inside = tmp_path / "inside"
    write_synthetic_run(inside, n_steps=1, seed=0)
    (inside / "meta.json").rename(inside / "real_meta.json")
    (inside / "meta.json").symlink_to("real_meta.json")  # a link within the run folder is fine
    assert load_run(inside).meta["finished"] is True


RECORD = textwrap.dedent(
    """
    import sys, time, torch
    from tokengrad import Recorder
    from tokengrad.record import RunInfo
    rec = Recorder(sys.argv[1], config={"lr": 1.0}, info=RunInfo(name="k")).open()
    for step in range(int(sys.argv[2])):
        with rec.step(step) as st:
            lp = torch.full((2, 3), -1.0, requires_grad=True)
            st.track(lp, token_ids=torch.zeros(2, 3, dtype=torch.long), mask=torch.ones(2, 3))
            st.backward(-lp.sum())
            st.log(loss=float(step))
    rec.flush()
    print("recorded", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.subprocess
@pytest.mark.parametrize("steps", [3, 0], ids=["three_steps", "no_step"])
def test_a_killed_recording_process_is_stopped_at_once_and_watch_says_so(tmp_path, capsys, steps):
    run = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-c", RECORD, str(run), str(steps)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "recorded"
        s = run_status(run)
        assert (s.state, s.steps_seen) == ("running", steps > 0) and f"(pid {proc.pid}) runs" in s.why
        proc.send_signal(signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie is gone too
        s = run_status(run)
        last = f"last committed step {steps - 1}" if steps else "no step was committed"
        assert s.state == "stopped" and s.why == (
            f"the recording process (pid {proc.pid}) is gone: killed or crashed; {last}"
        )
    finally:
        proc.kill()
        proc.wait()
    assert run_status(run).state == "stopped"
    assert main(["watch", str(run), "--interval", "0.1"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tokengrad watch: {run} stopped: {s.why}"]
