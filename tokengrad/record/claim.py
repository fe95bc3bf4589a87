"""The claim on a run directory: one process records each rank of a run at a time.

A claim is the file RUN/ranks/rankRRR.lock holding the owner's pid, host and start time. It is created by
a hard link from a finished temporary file, which succeeds for one process only (and never leaves an empty
lock behind), before any work: the trainer takes it before its model loads, a Recorder when it opens
(adopting the claim its own process already took for it). It is removed when the recording ends.

A second process is refused with the owner's pid and host. So is a second Recorder in the same process.
A claim whose owner is gone is *stale*: on the same host, a claim whose pid no longer runs is broken
automatically (with a warning). A claim left by a process on another host (a shared file system) cannot
be checked from here: after making sure that process has ended, delete the lock file the error names.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from pathlib import Path

from tokengrad import schema

_HELD: dict[str, "Claim"] = {}  # lock path -> the claim this process holds


class RunClaimedError(OSError):
    """The run directory (this rank of it) is being recorded by another process or Recorder."""


class Claim:
    """This process's claim on one rank of a run directory; `owner` is the Recorder recording it."""

    def __init__(self, path: Path, created: list[Path]):
        self.path = path
        self.created = created  # folders the claim made, removed again if nothing else came into them
        self.owner: object | None = None

    def release(self) -> None:
        """Remove the lock file (idempotent); only the claim this process holds."""
        if _HELD.get(str(self.path)) is self:
            del _HELD[str(self.path)]
            self.path.unlink(missing_ok=True)
            for folder in self.created:  # a refused config leaves no empty run directory behind
                try:
                    folder.rmdir()
                except OSError:
                    break


def lock_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / schema.RANKS_DIR / f"rank{rank:03d}.lock"


def take(run_dir: str | os.PathLike, rank: int = 0) -> Claim:
    """Claim rank `rank` of `run_dir` for this process (creating the directory); RunClaimedError if another
    process or claim of this process holds it."""
    path = lock_path(Path(run_dir), rank)
    if str(path) in _HELD:
        raise RunClaimedError(f"{run_dir} is already being recorded by this process ({path} is held)")
    created = [p for p in (path.parent, path.parent.parent) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # a second try after breaking a stale claim
        if _create(path):
            claim = _HELD[str(path)] = Claim(path, created)
            return claim
        holder = _holder(path)
        if not _is_stale(holder):
            raise RunClaimedError(_refusal(run_dir, path, holder))
        warnings.warn(
            f"tokengrad: broke the stale claim {path} of pid {holder.get('pid')}, which no longer runs",
            RuntimeWarning,
            stacklevel=2,
        )
        path.unlink(missing_ok=True)
    raise RunClaimedError(_refusal(run_dir, path, _holder(path)))


def adopt(run_dir: str | os.PathLike, rank: int, owner: object) -> Claim:
    """The claim a Recorder records under: the one its process took for it (the trainer's), else a new
    one. A claim another Recorder of this process records under is refused."""
    held = _HELD.get(str(lock_path(Path(run_dir), rank)))
    if held is not None and held.owner is not None and held.owner is not owner:
        raise RunClaimedError(
            f"{run_dir} is already being recorded by another open Recorder in this process; close it "
            "first (two Recorders on one directory would interleave and lose rows)"
        )
    claim = held or take(run_dir, rank)
    claim.owner = owner
    return claim


def _create(path: Path) -> bool:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    tmp.write_text(json.dumps(info))
    try:
        os.link(tmp, path)  # atomic, and fails when the lock exists
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _holder(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _is_stale(holder: dict) -> bool:
    """The holder ran on this host and its pid is gone (an unreadable lock is not judged stale)."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # runs, as another user
        return False
    return False


def _refusal(run_dir, path: Path, holder: dict) -> str:
    since = holder.get("started")
    when = ""
    if isinstance(since, float):
        when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(since))
    who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{when}"
    return (
        f"{run_dir} is being recorded by {who} (claim {path}); wait for it to end or use another run "
        f"directory. If that process is gone (e.g. it ran on another host), delete {path} to break the claim"
    )
