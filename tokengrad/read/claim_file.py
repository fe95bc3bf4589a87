"""The claim file of a run's rank (ranks/rankRRR.lock): what it holds and whether the process it names still
runs. Written by tokengrad.record.store.claim, read there and by tokengrad.read.status. Standard library only.

A claim names its process by pid, host name, the process's start time (field 22 of /proc/PID/stat, clock
ticks since boot) and the machine's boot id (/proc/sys/kernel/random/boot_id). A pid alone is not enough:
pids repeat after a restart (a restarted container hands its first processes the pids the old ones had), so
a live pid whose start time or boot id differs from the claim's is another process. On another host nothing
can be checked.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import NamedTuple

from tokengrad import schema

MAX_BYTES = 64 * 1024  # a claim is ~150 bytes; a larger file is not one (and is never read whole)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class Holder(NamedTuple):
    """The process a claim names."""

    pid: int
    host: str
    started: float | None  # wall clock, for messages
    proc_start: int | None  # start time in clock ticks since boot (None: not recorded, or no /proc)
    boot_id: str | None


class Verdict(NamedTuple):
    """Whether the claim's process runs: "alive", "gone", or "elsewhere" (another host: cannot tell)."""

    state: str
    why: str


def lock_path(run_dir: str | os.PathLike, rank: int) -> Path:
    return Path(run_dir) / schema.RANKS_DIR / f"rank{rank:03d}.lock"


def lock_paths(run_dir: str | os.PathLike) -> list[Path]:
    """Every rank's claim file of the run (ranks/rankRRR.lock), in rank order."""
    return sorted((Path(run_dir) / schema.RANKS_DIR).glob("rank*.lock"))


@functools.cache
def boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:  # no /proc (not Linux)
        return None


def process_state(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks since boot) of a running pid from /proc; None without it."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
        fields = data[data.rindex(b")") + 2 :].split()  # after "pid (comm) ", comm may hold anything
        return fields[0].decode(), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def this_process() -> dict:
    """What a claim taken by this process holds."""
    now = process_state(os.getpid())
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.time(),
        "proc_start": now[1] if now else None,
        "boot_id": boot_id(),
    }


def read_fd(fd: int) -> Holder | str:
    """The holder of an open claim file, or why the file is not a claim (one phrase)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return "is not a regular file"
    data = os.pread(fd, MAX_BYTES + 1, 0)
    if len(data) > MAX_BYTES:
        return f"is larger than {MAX_BYTES // 1024} KiB"
    return parse(data)


def read(path: Path) -> Holder | str | None:
    """The holder named by the claim file at `path`; why it is unusable; None if there is none. Never
    blocks (a FIFO in its place is refused) and never follows a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    try:
        return read_fd(fd)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    finally:
        os.close(fd)


def parse(data: bytes) -> Holder | str:
    if not data.strip():
        return "is empty"
    try:
        info = json.loads(data)
    except (ValueError, RecursionError):
        return "is not JSON"
    if not isinstance(info, dict):
        return f"holds a JSON {type(info).__name__}, not an object"
    pid, host = info.get("pid"), info.get("host")
    if type(pid) is not int or not 0 < pid < 2**31:
        return f"names no process (pid {json.dumps(pid)[:40]} is not a process id)"
    if not isinstance(host, str):
        return f"names no host (host {json.dumps(host)[:40]})"
    started, proc_start, boot = info.get("started"), info.get("proc_start"), info.get("boot_id")
    return Holder(
        pid=pid,
        host=host,
        started=float(started) if type(started) in (int, float) else None,
        proc_start=proc_start if type(proc_start) is int else None,
        boot_id=boot if isinstance(boot, str) and boot else None,
    )


def verdict(holder: Holder) -> Verdict:
    """Whether the holder's process still runs (module doc). A claim naming this very process counts as
    alive only when its start time is this process's own: else it is a process that had this pid before."""
    if holder.host != socket.gethostname():
        return Verdict("elsewhere", f"it was taken on host {holder.host}, which cannot be checked from here")
    if holder.boot_id and boot_id() and holder.boot_id != boot_id():
        return Verdict("gone", "it ran before this machine restarted (the boot id differs)")
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return Verdict("gone", "it no longer runs")
    except PermissionError:  # runs, as another user
        pass
    now = process_state(holder.pid)
    if now is not None and now[0] in ("Z", "X"):
        return Verdict("gone", "it has exited")
    if holder.proc_start is not None and now is not None and now[1] != holder.proc_start:
        return Verdict("gone", "its pid now belongs to another process (the start time differs)")
    if holder.proc_start is None and now is not None and holder.started is not None:
        began = _wall_time(now[1])  # a claim without a start time (an older tokengrad): compare clocks
        if began is not None and began > holder.started + 2.0:
            return Verdict("gone", "its pid now belongs to a process that started after the claim was taken")
    if holder.pid == os.getpid() and holder.proc_start is None and now is not None:
        # this process would have written its start time: an earlier process with this pid wrote it
        return Verdict(
            "gone", "its pid is this process's own: an earlier process with this pid took the claim"
        )
    return Verdict("alive", "it runs")


def _wall_time(ticks: int) -> float | None:
    """The wall-clock time `ticks` clock ticks after boot (boot time from /proc/stat)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        pass
    return None
