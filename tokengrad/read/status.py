"""Whether a run is running, finished, crashed or stopped, from what its writer leaves on disk.

    run_status("runs/grpo")      # -> RunStatus(state="running", last_write=..., steps_seen=True, ...)

A Recorder claims each rank it records (ranks/rankRRR.lock, tokengrad.read.claim_file), writes meta.json
with finished = false when it opens, and on close rewrites it (and each rank's ranks/rankRRR.json) with
finished = true, or false when the training loop raised, then removes its claim. So:

- finished: meta.json says finished;
- crashed: a rank status written at close says unfinished (the training loop raised);
- running: never closed, and a claim's process runs on this host (however long ago the last write);
- stopped: never closed and the recording process is gone (killed, out of memory, a machine restart),
  known at once when every claim names a process of this host that no longer runs (the why names it and
  the last committed step);
- otherwise (a claim taken on another host cannot be checked; no claim: a run of an older tokengrad) the
  clock decides: running while some file of the run changed within STALE_S, else stopped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import NamedTuple

from tokengrad.read import claim_file, layout, meta_file, remote

STALE_S = 15 * 60  # no file written for this long and never closed: the writer is gone
STATES = ("running", "finished", "crashed", "stopped")


class RunStatus(NamedTuple):
    state: str  # one of STATES
    last_write: float  # newest mtime of meta.json, rank status and table files (seconds since the epoch)
    steps_seen: bool  # whether any steps-table file exists yet ("waiting for the first step" otherwise)
    why: str  # one line for a tooltip
    last_step: int | None = None  # the last committed step of a stopped run (None: none, or not looked up)


def _newest(run: Path) -> tuple[float, bool]:
    """(newest mtime of the run's files, whether any steps file exists) from layout.run_files."""
    newest = max((_mtime(p) for p in layout.run_files(run)), default=0.0)
    return newest, bool(layout.data_files(run, "steps"))


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:  # removed by a compaction between listing and stat
        return 0.0


def _meta(run: Path) -> dict:
    """meta.json as load_run reads it (never through a link out of the run); {} when missing or damaged."""
    try:
        return meta_file.read_meta(run)
    except (OSError, ValueError):  # FileNotFoundError, MetaError
        return {}


def _claims(run: Path) -> list[tuple[claim_file.Holder, claim_file.Verdict]]:
    """The readable claims of the run's ranks with whether their processes run (unusable files left out)."""
    out = []
    for path in claim_file.lock_paths(run):
        holder = claim_file.read(path)
        if isinstance(holder, claim_file.Holder):
            out.append((holder, claim_file.verdict(holder)))
    return out


def last_step(run_dir: str | os.PathLike) -> int | None:
    """The highest step in the run's newest committed steps file of each rank (footer statistics)."""
    best = None
    for folder in layout.rank_folders(Path(run_dir), "steps"):
        found = layout.entries(folder)
        if found:
            rng = layout.step_range(max(found, key=lambda e: (e[1], e[0]))[2])
            if rng is not None and (best is None or rng[1] > best):
                best = rng[1]
    return best


def run_status(run_dir: str | os.PathLike, now: float | None = None, stale_s: float = STALE_S) -> RunStatus:
    """The run's state (module doc); `now` defaults to the clock. A run URL is read from its local copy."""
    run = remote.local_copy(run_dir, tables=("steps",))  # the state needs the steps files, not the tokens
    now = time.time() if now is None else now
    newest, steps = _newest(run)
    if meta_file.finished(_meta(run)):
        return RunStatus(
            state="finished", last_write=newest, steps_seen=steps, why="the recorder closed the run normally"
        )
    closed = []
    for p in layout.rank_status_files(run):
        try:
            closed.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    if any(isinstance(c, dict) and c.get("finished") is False for c in closed):
        return RunStatus(
            state="crashed",
            last_write=newest,
            steps_seen=steps,
            why="the training loop raised: the recorder closed it unfinished",
        )
    idle = now - newest
    claims = _claims(run)
    alive = [h for h, v in claims if v.state == "alive"]
    if alive:
        return RunStatus(
            state="running",
            last_write=newest,
            steps_seen=steps,
            why=f"the recording process (pid {alive[0].pid}) runs; {_written(idle)}",
        )
    gone = [(h, v) for h, v in claims if v.state == "gone"]
    if gone and len(gone) == len(claims):  # every claim checked here (another host's: the clock rule)
        holder, verdict = gone[0]
        cause = "killed or crashed" if "restarted" not in verdict.why else "the machine restarted"
        return _stopped(run, newest, steps, f"the recording process (pid {holder.pid}) is gone: {cause}")
    if idle <= stale_s:
        return RunStatus(state="running", last_write=newest, steps_seen=steps, why=_written(idle))
    return _stopped(run, newest, steps, f"never closed and no file written for {idle / 60:.0f} min")


def _stopped(run: Path, newest: float, steps: bool, why: str) -> RunStatus:
    step = last_step(run) if steps else None
    last = f"last committed step {step}" if step is not None else "no step was committed"
    return RunStatus(
        state="stopped", last_write=newest, steps_seen=steps, why=f"{why}; {last}", last_step=step
    )


def _written(idle: float) -> str:
    return f"last file written {idle:.0f} s ago" if idle < 1e9 else "no file written yet"


def not_uploaded(rank_status: list[dict]) -> list[dict]:
    """The upload entries of a run in a bucket whose rank closed with files not uploaded yet
    (`Run.rank_status` in; each entry's `rank`, `files_not_uploaded`, `url`, `staging` out; store/bucket.py
    writes them)."""
    out = []
    for status in rank_status:
        upload = status.get("upload")
        n = upload.get("files_not_uploaded") if isinstance(upload, dict) else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            out.append({"rank": status.get("rank"), **upload})
    return out
