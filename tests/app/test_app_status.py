"""The landing page tells a stopped run from a running one (read/status.py through app/views/overview):
the status column, and a run without steps whose process died is stopped, not waiting for its first step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest
from synthetic_runs import write_meta, write_synthetic_run

from tokengrad.read import claim_file, served_root

APP = Path(__file__).resolve().parents[2] / "tokengrad" / "app" / "streamlit_app.py"


def claim_of(run, **fields) -> None:
    path = claim_file.lock_path(run, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**claim_file.this_process(), **fields}))


def test_the_landing_page_says_which_runs_stopped(tmp_path, monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    killed = write_synthetic_run(tmp_path / "killed", n_steps=4, seed=0)
    write_meta(killed, "killed", 4, 2, finished=False)
    claim_of(killed, pid=gone.pid)  # written just now: the clock alone would say running
    live = write_synthetic_run(tmp_path / "live", n_steps=4, seed=1)
    write_meta(live, "live", 4, 2, finished=False)
    claim_of(live)  # this process records it
    for name, pid in (("empty_killed", gone.pid), ("empty_live", None)):
        (tmp_path / name).mkdir()
        write_meta(tmp_path / name, name, 2, 0, finished=False)
        claim_of(tmp_path / name, **({"pid": pid} if pid else {}))
    monkeypatch.setenv(served_root.ENV_ROOT, str(tmp_path))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["runs"] = "killed,live,empty_killed,empty_live"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    status = at.dataframe[0].value.set_index("run")["status"].to_dict()
    assert status["killed"] == "stopped" and status["live"] == "running"
    warned = " ".join(w.value for w in at.warning)
    assert f"empty_killed stopped: the recording process (pid {gone.pid}) is gone" in warned
    assert "no step was committed" in warned and "empty_live stopped" not in warned
    assert "empty_live: waiting for the first step." in [i.value for i in at.info]
