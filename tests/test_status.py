"""Run status (tokengrad.read.status): finished, crashed (the loop raised, or the writer left), running."""

from __future__ import annotations

import json
import os
import time

from synthetic_runs import write_meta, write_synthetic_run

from tokengrad.read.status import STALE_S, run_status


def test_finished_running_and_crashed_runs(tmp_path):
    done = write_synthetic_run(tmp_path / "done", n_steps=2, seed=0)
    assert run_status(done).state == "finished"
    live = tmp_path / "live"
    live.mkdir()
    write_meta(live, "live", 2, 0, finished=False)  # opened, no step yet
    s = run_status(live)
    assert (s.state, s.steps_seen) == ("running", False)
    assert run_status(live, now=time.time() + STALE_S + 60).state == "crashed"  # never closed, gone quiet
    raised = write_synthetic_run(tmp_path / "raised", n_steps=2, seed=1)
    write_meta(raised, "raised", 2, 0, finished=False)
    (raised / "ranks").mkdir(exist_ok=True)
    (raised / "ranks" / "rank000.json").write_text(json.dumps({"rank": 0, "finished": False}))
    s = run_status(raised)
    assert (s.state, s.steps_seen) == ("crashed", True) and "raised" in s.why
    old = time.time() - 3600
    for p in live.rglob("*"):
        os.utime(p, (old, old))
    assert run_status(live).state == "crashed"
