"""The claim on a run directory: one process records each rank of a run at a time.

A claim is the file RUN/ranks/rankRRR.lock naming the owner: pid, host, start time and the machine's boot id
(tokengrad.read.claim_file). It is created by a hard link from a finished temporary file, which succeeds for
one process only (and never leaves an empty lock behind), before any work: the trainer takes it before its
model loads, a Recorder when it opens (adopting the claim its own process already took for it). It is
removed when the recording ends.

A second process is refused with the owner's pid and host. So is a second Recorder in the same process.
A claim whose owner is gone is *stale*: on the same host, a claim whose process no longer runs (its pid is
free, or now belongs to another process: a restarted container, a rebooted machine) is broken automatically,
with a warning. A claim left by a process on another host (a shared file system) cannot be checked from
here: after making sure that process has ended, delete the lock file the error names. A lock file that is no
claim (empty, not JSON, no pid) is refused with what is wrong with it.

Breaking is exclusive: a process inspects a claim holding an flock on the lock file, re-checks after taking
it that the file is still the one at the lock path, and removes it only then. Only a process holding that
flock removes a stale claim, and a new claim can only be linked once the path is free, so when several
processes find the same stale claim at once, one of them breaks it, one (that one or another) owns the
run and the others are refused by the new owner's claim. On a file system without flock the break is
unguarded (the re-check narrows the window, it cannot close it).
"""

from __future__ import annotations

import json
import os
import time
import warnings
from pathlib import Path

from tokengrad.read import claim_file
from tokengrad.read.claim_file import lock_path
from tokengrad.read.remote import cache_path, parse_url

try:
    import fcntl
except ImportError:  # not POSIX: stale claims are broken unguarded
    fcntl = None

__all__ = ["Claim", "RunClaimedError", "adopt", "lock_path", "move", "take"]

ATTEMPTS = 50  # claims created and broken under one taker before it gives up
INSPECT_WAIT_S = 10.0  # how long another process may keep inspecting a claim before a taker gives up

_HELD: dict[str, "Claim"] = {}  # lock path -> the claim this process holds


class RunClaimedError(OSError):
    """The run directory (this rank of it) is being recorded by another process or Recorder."""


class Claim:
    """This process's claim on one rank of a run directory; `owner` is the Recorder recording it."""

    def __init__(self, path: Path, created: list[Path], ident: tuple[int, int]):
        self.path = path
        self.created = created  # folders the claim made, removed again if nothing else came into them
        self.ident = ident  # (device, inode) of the lock file this claim linked
        self.pid = os.getpid()  # a forked child holds none of its parent's claims
        self.owner: object | None = None

    def release(self) -> None:
        """Remove the lock file (idempotent); only the claim this process holds, and only its own file."""
        if _HELD.get(str(self.path)) is self and self.pid == os.getpid():
            del _HELD[str(self.path)]
            if _identity(self.path) == self.ident:
                self.path.unlink(missing_ok=True)
            for folder in self.created:  # a refused config leaves no empty run directory behind
                try:
                    folder.rmdir()
                except OSError:
                    break


def take(run_dir: str | os.PathLike, rank: int = 0) -> Claim:
    """Claim rank `rank` of `run_dir` for this process (creating the directory); RunClaimedError if another
    process or claim of this process holds it."""
    run_dir = local_dir(run_dir)  # a run in a bucket is claimed in its staging folder (and in the bucket)
    path = lock_path(run_dir, rank)
    held = _HELD.get(str(path))
    if held is not None and held.pid == os.getpid():
        raise RunClaimedError(f"{run_dir} is already being recorded by this process ({path} is held)")
    created = [p for p in (path.parent, path.parent.parent) if not p.exists()]
    for _ in range(ATTEMPTS):
        path.parent.mkdir(parents=True, exist_ok=True)  # again: a releasing claim may have removed it
        ident = _create(path)
        if ident is not None:
            claim = _HELD[str(path)] = Claim(path, created, ident)
            return claim
        _break_if_stale(run_dir, path)  # raises while the claim holds; returns once it is gone
    raise RunClaimedError(
        f"{run_dir}: the claim {path} changed hands {ATTEMPTS} times while this process tried to take it; "
        "another process keeps claiming and releasing this run directory"
    )


def adopt(run_dir: str | os.PathLike, rank: int, owner: object) -> Claim:
    """The claim a Recorder records under: the one its process took for it (the trainer's), else a new
    one. A claim another Recorder of this process records under is refused."""
    held = _HELD.get(str(lock_path(local_dir(run_dir), rank)))
    if held is not None and held.pid != os.getpid():
        held = None
    if held is not None and held.owner is not None and held.owner is not owner:
        raise RunClaimedError(
            f"{run_dir} is already being recorded by another open Recorder in this process; close it "
            "first (two Recorders on one directory would interleave and lose rows)"
        )
    claim = held or take(run_dir, rank)
    claim.owner = owner
    return claim


def move(held: Claim, run_dir: str | os.PathLike, new_dir: str | os.PathLike) -> None:
    """Rename the claimed run directory `run_dir` to `new_dir` (os.rename: an empty `new_dir` is replaced,
    a non-empty one raises) and keep the claim on it: the lock file moves with its folder, its identity
    unchanged, so `held.release()` then removes it at its new place."""
    if _HELD.get(str(held.path)) is not held:
        raise RunClaimedError(f"{held.path} is not a claim this process holds; {run_dir} was not moved")
    os.rename(run_dir, new_dir)
    del _HELD[str(held.path)]
    held.path = Path(new_dir) / held.path.relative_to(run_dir)
    held.created = []  # the folders now belong to the moved run
    _HELD[str(held.path)] = held


def _create(path: Path) -> tuple[int, int] | None:
    """Link a finished claim of this process at `path`: its (device, inode), or None if one is there."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileNotFoundError:  # a claim releasing just now removed the folder it had made: try again
        return None
    try:
        os.write(fd, json.dumps(claim_file.this_process()).encode())
        os.fsync(fd)  # a machine that loses power leaves a whole claim or none, never an empty one
        st = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # atomic, and fails when the lock exists
        return st.st_dev, st.st_ino
    except FileExistsError:
        return None
    finally:
        tmp.unlink(missing_ok=True)


def _break_if_stale(run_dir, path: Path) -> None:
    """Remove the claim at `path` if its process is gone (module doc); RunClaimedError while it holds."""
    try:
        fd = _open(path)
    except FileNotFoundError:  # released meanwhile
        return
    except OSError as err:
        raise RunClaimedError(_unusable(run_dir, path, f"cannot be opened ({err.strerror})")) from None
    try:
        _inspect_lock(fd, path)
        st = os.fstat(fd)
        if _identity(path) != (st.st_dev, st.st_ino):  # broken and taken again while this one waited
            return
        holder = claim_file.read_fd(fd)
        if isinstance(holder, str):
            raise RunClaimedError(_unusable(run_dir, path, holder))
        verdict = claim_file.verdict(holder)
        if verdict.state != "gone":
            raise RunClaimedError(_refusal(run_dir, path, holder))
        warnings.warn(
            f"tokengrad: broke the stale claim {path} of pid {holder.pid}: {verdict.why}",
            RuntimeWarning,
            stacklevel=3,
        )
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)  # and with it the flock


def _open(path: Path) -> int:
    """The lock file, open without blocking (a FIFO) or following a link; for writing where allowed (NFS
    grants an exclusive flock only then)."""
    flags = os.O_NONBLOCK | os.O_NOFOLLOW
    try:
        return os.open(path, os.O_RDWR | flags)
    except FileNotFoundError:
        raise
    except OSError:  # another user's file, a directory, a link: read-only, or the reason
        return os.open(path, os.O_RDONLY | flags)


def _inspect_lock(fd: int, path: Path) -> None:
    """Hold the exclusive flock of the open lock file, waiting while another process inspects it."""
    if fcntl is None:
        return
    deadline = time.monotonic() + INSPECT_WAIT_S
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RunClaimedError(
                    f"another process has been inspecting the claim {path} for over {INSPECT_WAIT_S:.0f} s; "
                    "try again"
                ) from None
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        except OSError:  # a file system without flock
            return


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _refusal(run_dir, path: Path, holder: claim_file.Holder) -> str:
    when = ""
    if holder.started is not None:
        try:
            when = time.strftime(" since %Y-%m-%d %H:%M:%S", time.localtime(holder.started))
        except (ValueError, OverflowError, OSError):  # nan, or out of the clock's range
            pass
    who = f"pid {holder.pid} on host {holder.host}{when}"
    return (
        f"{run_dir} is being recorded by {who} (claim {path}); wait for it to end or use another run "
        f"directory. If that process is gone (e.g. it ran on another host), delete {path} to break the claim"
    )


def _unusable(run_dir, path: Path, why: str) -> str:
    return (
        f"{run_dir} cannot be claimed: its lock file {path} {why}, so which process records this run is "
        f"unknown. If none does, delete {path} to break the claim"
    )


def local_dir(run_dir: str | os.PathLike) -> Path:
    """The folder a writer commits into for `run_dir`: the staging folder of a run in a bucket
    (record/store/bucket.py), a local path as it is."""
    url = parse_url(run_dir)
    return Path(run_dir) if url is None else cache_path(url, "staging")


def in_bucket(run_dir: str | os.PathLike) -> bool:
    """Whether `run_dir` is a run's URL in a bucket (s3://...); a RemoteError for an unknown scheme."""
    return parse_url(run_dir) is not None
