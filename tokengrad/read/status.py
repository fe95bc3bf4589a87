"""Whether a run is running, finished or crashed, from what its writer leaves on disk.

    run_status("runs/grpo")      # -> RunStatus(state="running", last_write=..., steps_seen=True)

A Recorder writes meta.json with finished = false when it opens, and on close rewrites it (and each rank's
ranks/rankRRR.json) with finished = true, or false when the training loop raised. So: meta.json finished
-> "finished"; a rank status written at close with finished = false -> "crashed" (the loop raised); no
close yet -> "running" while some file of the run changed within STALE_S, else "crashed" (the process was
killed: nothing closed the run).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from tokengrad.schema import META_FILE, RANKS_DIR, TABLES

STALE_S = 15 * 60  # no file written for this long and never closed: the writer is gone
STATES = ("running", "finished", "crashed")


class RunStatus(NamedTuple):
    state: str  # one of STATES
    last_write: float  # newest mtime of meta.json, rank status and table files (seconds since the epoch)
    steps_seen: bool  # whether any steps-table file exists yet ("waiting for the first step" otherwise)
    why: str  # one line for a tooltip


def _newest(run: Path) -> tuple[float, bool]:
    newest, steps = 0.0, False
    for p in [run / META_FILE, *(run / RANKS_DIR).glob("rank*.json")]:
        newest = max(newest, _mtime(p))
    for table in TABLES:
        for p in (run / table).glob("rank*/s*.parquet"):
            newest = max(newest, _mtime(p))
            steps = steps or table == "steps"
    return newest, steps


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:  # removed by a compaction between listing and stat
        return 0.0


def run_status(run_dir: str | os.PathLike, now: float | None = None, stale_s: float = STALE_S) -> RunStatus:
    """The run's state (module doc); `now` defaults to the clock."""
    run = Path(run_dir)
    now = time.time() if now is None else now
    newest, steps = _newest(run)
    try:
        meta = json.loads((run / META_FILE).read_text())
    except (OSError, ValueError):
        meta = {}
    if meta.get("finished") is True:
        return RunStatus("finished", newest, steps, "the recorder closed the run normally")
    closed = []
    for p in sorted((run / RANKS_DIR).glob("rank*.json")):
        try:
            closed.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    if any(isinstance(c, dict) and c.get("finished") is False for c in closed):
        return RunStatus(
            "crashed", newest, steps, "the training loop raised: the recorder closed it unfinished"
        )
    idle = now - newest
    if idle <= stale_s:
        return RunStatus("running", newest, steps, f"last file written {idle:.0f} s ago")
    return RunStatus(
        "crashed",
        newest,
        steps,
        f"never closed and no file written for {idle / 60:.0f} min: the process is gone",
    )
