"""Files the trainer writes that must never be left half-written under their final name (the checkpoint's
trainer.pt, lab models): written under a temporary name in the same folder, fsynced, renamed into place;
the temporary is removed when the write fails.

fsync matters for the full disk as much as for power loss: on file systems that allocate late (XFS, ext4
with delalloc, NFS) ENOSPC may only surface when the data is flushed, and a file renamed into place before
that would look complete.

A failed write is told apart from a bug (`write_error`), and a full disk is named with its mount point and
free space (`describe_disk`), so the one line a user reads says which disk to clear.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
from pathlib import Path
from typing import Callable

import torch

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # no space left, or the user's quota reached
_OS_ERROR_TEXT = re.compile(r"\(os error (\d+)\)")


def write_error(err: BaseException) -> OSError | None:
    """The OSError behind a failed write, or None for an error that is not the disk's.

    torch.save's zip writer replaces the OSError of its file with a RuntimeError ("unexpected pos ..."),
    keeping the OSError as its __context__; safetensors raises its own error, whose text ends in
    "(os error 28)". Both come back as the OSError they stand for."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError):
            return err
        found = _OS_ERROR_TEXT.search(str(err))
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
        err = err.__cause__ or err.__context__
    return None


def is_disk_full(err: OSError) -> bool:
    return err.errno in DISK_FULL


def mount_point(path: str | Path) -> Path:
    """The mount point of the file system holding `path` (its nearest existing folder)."""
    p = Path(os.path.abspath(path))
    while not p.exists():
        p = p.parent
    while not os.path.ismount(p):
        p = p.parent
    return p


def describe_disk(path: str | Path) -> str:
    """'the disk mounted at MOUNT (FREE free of TOTAL)' for the file system holding `path`."""
    mount = mount_point(path)
    try:
        usage = shutil.disk_usage(mount)
    except OSError:  # the size is a courtesy: the mount point alone still says which disk
        return f"the disk mounted at {mount}"
    return f"the disk mounted at {mount} ({_size(usage.free)} free of {_size(usage.total)})"


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def save_torch(obj, path: Path) -> None:
    """torch.save `obj` to `path` through `.NAME.tmp` in the same folder, fsynced, then renamed; on any
    failure the temporary is removed and `path` is untouched (the error is re-raised)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # through a Python file, so that the disk's OSError is raised (as the RuntimeError's context)
        # rather than only a C++ stream error
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def fsync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then the folders themselves."""
    for root, _, files in os.walk(folder, topdown=False):  # a folder after everything in it
        for name in files:
            with open(Path(root) / name, "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(root))


def fsync_dir(folder: Path) -> None:
    """fsync a folder, so that the names renamed into it survive a power loss. Best effort: some file
    systems refuse fsync on a folder (EINVAL); the files' own fsync is what reports a full disk."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_folder(out: Path, write: Callable[[Path], None]) -> Path:
    """Replace the folder `out` with what `write(folder)` writes, never leaving a partial `out`: written into
    `.NAME.tmp` beside it and fsynced, then swapped in (the old one goes once the new one is in place). On
    failure the temporary is removed and `out` is untouched (the error is re-raised)."""
    tmp, old = out.with_name(f".{out.name}.tmp"), out.with_name(f".{out.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        write(tmp)
        fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    fsync_dir(out.parent)
    shutil.rmtree(old, ignore_errors=True)
    return out
