"""The background uploader of a run in a bucket: copies each file one rank commits locally to the bucket.

The writer commits into a local staging folder exactly as into any run directory (whole files renamed
into place); this thread looks at that rank's files every SCAN_S seconds and copies to the bucket each one
that is new or changed since it was last copied (size and modification time), data files first, then the
rank's status file, then meta.json (rank 0), so a reader of the bucket never finds a status naming steps
whose files are not there yet. The training thread never waits on it.

An upload that fails (network down, store refusing) ends that pass; the next pass is tried after a backoff
that doubles from RETRY_FIRST_S to RETRY_MAX_S, forever, and `not_uploaded` says how many files are behind.
The local copy is never deleted. A file this rank had in the bucket and no longer has locally (small files a
compaction merged, steps a resume removed) is deleted from the bucket only in a pass that uploaded every
other file first, so the merged file that holds its rows is already there (readers ignore contained ranges,
tokengrad.read.layout).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow.fs as pafs

from tokengrad import schema
from tokengrad.faults import fault_point
from tokengrad.read import layout
from tokengrad.read.remote import Url, describe

SCAN_S = 0.5  # how often the staging folder is looked at
RETRY_FIRST_S = 0.5  # the first wait after a failed pass, doubled after each further failure
RETRY_MAX_S = 30.0

Signature = tuple[int, int]  # (size, mtime_ns) of a local file


def status_rel(rank: int) -> str:
    return f"{schema.RANKS_DIR}/rank{rank:03d}.json"


def rank_files(staging: Path, rank: int) -> dict[str, Path]:
    """This rank's files in the staging folder by their path relative to it, in upload order: data files,
    the rank's status file, meta.json (rank 0 writes it). Temporary dot files and the local claim never."""
    out = {}
    for table in schema.TABLES:
        for _, _, p in sorted(layout.entries(staging / schema.rank_dir(table, rank))):
            out[p.relative_to(staging).as_posix()] = p
    for rel in [status_rel(rank)] + ([schema.META_FILE] if rank == 0 else []):
        if (staging / rel).is_file():
            out[rel] = staging / rel
    return out


def owned(rel: str, rank: int) -> bool:
    """Whether a file of the bucket (path relative to the run) is one this rank writes."""
    parts = rel.split("/")
    data = (
        len(parts) == 3
        and parts[0] in schema.TABLES
        and f"{parts[0]}/{parts[1]}" == schema.rank_dir(parts[0], rank)
    )
    return data or rel == status_rel(rank) or (rank == 0 and rel == schema.META_FILE)


def _signature(path: Path) -> Signature | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _is_data(rel: str) -> bool:
    return rel.endswith(".parquet")


class Uploader:
    """Copies one rank's committed files from `staging` to `url` on a thread of its own (module doc).

    Args:
        fs, url: the bucket's filesystem and the run's URL (tokengrad.read.remote).
        staging: the local folder the rank's writer commits into.
        rank: the rank whose files this uploader copies.
        present: what the bucket holds already (relative path -> pyarrow FileInfo): a file of the same size
            and no older than the local one counts as uploaded (a resumed run uploads only what is missing).
    """

    def __init__(self, fs: pafs.FileSystem, url: Url, staging: Path, rank: int, present: dict):
        self.fs, self.url, self.staging, self.rank = fs, url, staging, rank
        self._sent: dict[str, Signature | None] = {}  # what the bucket holds of this rank, as copied
        for rel, info in present.items():
            if owned(rel, rank):
                local = _signature(staging / rel)
                same = local is not None and local[0] == info.size and local[1] <= (info.mtime_ns or 0)
                self._sent[rel] = local if same else None
        self.not_uploaded = len(self.pending())
        self.last_error: str | None = None
        self.passes = 0  # passes finished
        self._began = 0  # passes begun
        self._done = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._hurry = False
        self._thread = threading.Thread(target=self._loop, name=f"tokengrad-upload-{rank}", daemon=True)
        self._thread.start()

    def pending(self) -> list[str]:
        """This rank's local files the bucket does not hold as they are now (no network)."""
        return [
            rel
            for rel, p in rank_files(self.staging, self.rank).items()
            if self._sent.get(rel) != _signature(p)
        ]

    def drain(self, timeout: float) -> int:
        """Wait up to `timeout` seconds until a pass begun after this call has uploaded everything; returns
        how many files are still not uploaded."""
        with self._done:
            target = self._began + 1  # a pass that begins after this call (the running one may not see all)
        self._hurry = True  # failures retried at RETRY_FIRST_S while someone waits
        self._wake.set()
        with self._done:
            self._done.wait_for(
                lambda: (self.passes >= target and self.not_uploaded == 0) or not self._thread.is_alive(),
                timeout,
            )
        self._hurry = False
        return len(self.pending())

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=RETRY_MAX_S)

    def _loop(self) -> None:
        delay = SCAN_S
        while not self._stop.is_set():
            ok = self._pass()
            delay = SCAN_S if ok else min(max(2 * delay, RETRY_FIRST_S), RETRY_MAX_S)
            self._wake.wait(RETRY_FIRST_S if self._hurry and not ok else delay)
            self._wake.clear()

    def _pass(self) -> bool:
        with self._done:
            self._began += 1
            this = self._began
        local = rank_files(self.staging, self.rank)
        todo = [(rel, p) for rel, p in local.items() if self._sent.get(rel) != _signature(p)]
        left = len(todo)
        try:
            for rel, path in todo:
                sig = _signature(path)  # before the copy: a file rewritten meanwhile is copied again
                fault_point("upload")
                pafs.copy_files(
                    str(path),
                    self.url.child(rel).path,
                    source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=self.fs,
                )
                self._sent[rel] = sig
                left -= 1
            for rel in [r for r in self._sent if r not in local and _is_data(r)]:
                try:
                    self.fs.delete_file(self.url.child(rel).path)
                except FileNotFoundError:  # deleted already (an earlier pass that failed after it)
                    pass
                del self._sent[rel]
            error = None
        except (OSError, ValueError) as err:  # kept for the next pass; the local file stays
            error = str(describe(self.url, err))
        with self._done:
            self.not_uploaded, self.last_error = left, error or self.last_error
            self.passes = this
            self._done.notify_all()
        return error is None
