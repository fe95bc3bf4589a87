"""Background Parquet writer of one rank: durable per-step commits, compaction, no silent drops.

The training thread hands over a *bundle* (table name -> pyarrow Table, or a zero-argument callable that
builds one, so that row building also happens off the training thread). The writer thread commits each
table of the bundle as one file named by a per-rank commit sequence number, atomically (temp file, then
os.replace), so a process killed at any moment leaves only whole files. Every `compact_every` commits the
small files of a table are merged into one file covering their sequence range; the reader drops files whose
range is contained in another, so compaction needs no lock (tokengrad.read.layout resolves the ranges, and a
writer opening a rank folder again first removes what a kill left over there). The small files a merge
covers stay in place for RETIRE_GRACE_S seconds (removed by a later compaction or at close), so a reader
holding a listing made just before the merge still finds every file it named.

A failure while writing (unwritable directory, disk full) never stops training by default: the rows are
counted as dropped (the exact number: a payload the writer builds says how many rows it holds, see Rows),
a warning names the error, and the count goes to the rank's status file and meta.json. With
on_error="raise" the error is re-raised in the training thread at the next submit/wait_for/flush/close.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokengrad import schema
from tokengrad.faults import fault_point
from tokengrad.read import layout
from tokengrad.record.store import strict_json


class Rows(NamedTuple):
    """A table the writer thread builds: `build()` returns it (or None); `n` is how many rows it will hold,
    known on the training thread, so rows lost while building are counted exactly."""

    build: Callable[[], "pa.Table | None"]
    n: int


Payload = Union[pa.Table, Rows, Callable[[], "pa.Table | None"]]
_STOP = object()
COMPRESSION = "zstd"
MAX_BATCH = 16  # bundles committed together at most, when they have queued up
# How long merged-away small files stay readable: far longer than a reader needs from listing to opening
# (~0.1 s for 2,000 steps), short enough that a live run holds few redundant files.
RETIRE_GRACE_S = 10.0


def atomic_write_json(path: Path, obj: dict) -> None:
    """Write strict JSON (strict_json.py: NaN/inf as null; a non-string key raises ValueError
    before anything is written) to `path` by rename: readers see the old file or the new one."""
    text = strict_json.dumps(obj)
    fault_point("meta")
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not also keep a half-written file around
        raise


def _n_rows(payload) -> int | None:
    if isinstance(payload, Rows):
        return payload.n
    return payload.num_rows if isinstance(payload, pa.Table) else None


class RunWriter:
    """Commits bundles of tables for one rank of a run directory on a background thread.

    Args:
        run_dir: the run directory (created if missing).
        rank: process rank; files go to RUN/{table}/rank{rank:03d}/.
        on_error: "count" (default: drop and count rows, warn) or "raise".
        compact_every: merge a table's small files once this many have accumulated.
        max_queue: bundles waiting before submit() blocks (back-pressure instead of unbounded memory).
        rows_dropped: counts carried over from an earlier session of this rank (a resumed or re-opened
            run), so the run's total stays right.
        retire_grace_s: seconds the small files a merge covers stay (default RETIRE_GRACE_S).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        rank: int = 0,
        *,
        on_error: str = "count",
        compact_every: int = 64,
        max_queue: int = 8,
        rows_dropped: dict[str, int] | None = None,
        retire_grace_s: float | None = None,
    ):
        if on_error not in ("count", "raise"):
            raise ValueError(f"on_error must be 'count' or 'raise', got {on_error!r}")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.on_error = on_error
        self.compact_every = compact_every
        self.retire_grace_s = RETIRE_GRACE_S if retire_grace_s is None else retire_grace_s
        self._retired: list[tuple[float, list[Path]]] = []  # (when merged, the small files it covers)
        self.rows_dropped: dict[str, int] = dict(rows_dropped or {})
        self.rows_written: dict[str, int] = {}
        self.last_committed: int = -1  # last bundle sequence number fully handled
        self._committed = threading.Condition()
        self._error: BaseException | None = None
        self.repaired = self._repair()
        self._seq = self._next_sequence()
        self._small: dict[str, list[tuple[int, Path]]] = {t: self._existing_small(t) for t in schema.TABLES}
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._loop, name=f"tokengrad-writer-{rank}", daemon=True)
        self._thread.start()

    # ---- training-thread side -------------------------------------------------------------------
    def submit(self, bundle: dict[str, Payload]) -> int:
        """Queue a bundle for commit; returns its sequence number. Never drops it silently."""
        self._raise_pending()
        seq = self._seq
        self._seq += 1
        self._queue.put((seq, bundle))
        return seq

    def wait_for(self, seq: int) -> None:
        """Block until bundle `seq` (and every earlier one) has been handled."""
        with self._committed:
            self._committed.wait_for(lambda: self.last_committed >= seq or not self._thread.is_alive())
        self._raise_pending()

    def flush(self) -> None:
        """Block until every submitted bundle has been committed (or counted as dropped)."""
        self._queue.join()
        self._raise_pending()

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put((None, _STOP))
            self._thread.join()
        self._compact_all()
        self._remove_retired(math.inf)
        self._raise_pending()

    # ---- writer-thread side ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            items = [self._queue.get()]
            # When bundles queue up (steps faster than writing), commit them together: one file per table
            # covering their sequence range, which amortises the per-file cost. A lone bundle (the normal
            # case) is committed at once, so batching never delays durability.
            while len(items) < MAX_BATCH and items[-1][1] is not _STOP:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = items[-1][1] is _STOP
            work = items[:-1] if stop else items
            try:
                if work:
                    self._commit([seq for seq, _ in work], [b for _, b in work])
                    with self._committed:
                        self.last_committed = work[-1][0]
                        self._committed.notify_all()
            finally:
                for _ in items:
                    self._queue.task_done()
            if stop:
                return

    def _commit(self, seqs: list[int], bundles: list[dict[str, Payload]]) -> None:
        tables = dict.fromkeys(t for b in bundles for t in b)
        for table in tables:
            parts = []
            for bundle in bundles:
                payload = bundle.get(table)
                try:
                    build = payload.build if isinstance(payload, Rows) else payload
                    data = build() if callable(build) else build
                    if data is not None and data.num_rows:
                        parts.append(data)
                except Exception as err:  # never lose the training run to a writer failure
                    self._record_failure(table, _n_rows(payload), err)
            if parts:
                self._write_parts(table, seqs[0], seqs[-1], parts)
        for table, files in self._small.items():
            if len(files) >= self.compact_every:
                self._compact(table)

    def _write_parts(self, table: str, first: int, last: int, parts: list[pa.Table]) -> None:
        try:
            fault_point("commit")
            data = parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")
            self._write_file(table, first, last, data, small=True)
            self.rows_written[table] = self.rows_written.get(table, 0) + data.num_rows
        except Exception as err:
            self._record_failure(table, sum(t.num_rows for t in parts), err)

    def _write_file(self, table: str, first: int, last: int, data: pa.Table, small: bool = False) -> Path:
        folder = self.run_dir / schema.rank_dir(table, self.rank)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / schema.file_name(first, last)
        self._write_atomic(data, path)
        if small:  # a commit (not a compaction): merged later
            self._small[table].append((first, last, path))
        return path

    def _write_atomic(self, data: pa.Table, path: Path) -> None:
        """Write `data` to `path` through a temporary file and a rename, with page checksums (a reader then
        detects a corrupt page behind a valid footer)."""
        fault_point("write")
        tmp = layout.tmp_path(path)
        # dictionary-encode only the non-float columns: floats do not repeat, and encoding them costs ~2.5x
        dict_cols = [f.name for f in data.schema if not pa.types.is_floating(f.type)]
        try:
            pq.write_table(
                data, tmp, compression=COMPRESSION, use_dictionary=dict_cols, write_page_checksum=True
            )
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _record_failure(self, table: str, n: int | None, err: BaseException) -> None:
        # A bare callable payload (not Rows) that fails before it says its size cannot be counted: say so.
        self.rows_dropped[table] = self.rows_dropped.get(table, 0) + (n or 0)
        if self.on_error == "raise":
            self._error = self._error or err
        size = f"{n} rows" if n is not None else "an unknown number of rows, not counted"
        warnings.warn(
            f"tokengrad writer: could not write {table} ({size}) to {self.run_dir}: "
            f"{type(err).__name__}: {err}; rows counted as dropped",
            RuntimeWarning,
            stacklevel=2,
        )

    def _compact(self, table: str) -> None:
        files = sorted(self._small[table])
        if len(files) < 2:
            return
        try:
            merged = pa.concat_tables([pq.read_table(p) for _, _, p in files], promote_options="permissive")
            self._small[table] = []
            self._write_file(table, files[0][0], files[-1][1], merged)
            fault_point("compacted")
        except Exception as err:  # the small files stay valid; try again at the next threshold
            self._small[table] = files
            warnings.warn(
                f"tokengrad writer: compaction of {table} failed ({err}); small files kept",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        # The merged file now covers them (readers ignore contained ranges); they go after the grace period.
        self._retired.append((time.monotonic(), [p for _, _, p in files]))
        self._remove_retired(time.monotonic() - self.retire_grace_s)

    def _remove_retired(self, merged_before: float) -> None:
        """Remove the small files of merges made before `merged_before` (time.monotonic())."""
        while self._retired and self._retired[0][0] <= merged_before:
            for p in self._retired.pop(0)[1]:
                p.unlink(missing_ok=True)
                fault_point("unlinked")

    def _compact_all(self) -> None:
        for table in self._small:
            self._compact(table)

    def _raise_pending(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise RuntimeError(f"tokengrad writer failed: {err}") from err

    # ---- resume support --------------------------------------------------------------------------
    def drop_steps_from(self, step: int) -> int:
        """Remove this rank's rows with step >= `step` (a run resumed from an earlier checkpoint would
        otherwise record those steps twice). Each affected file is rewritten atomically; returns rows
        removed."""
        self.flush()
        removed = 0
        for table in schema.TABLES:
            folder = self.run_dir / schema.rank_dir(table, self.rank)
            for p in sorted(folder.glob("s*.parquet")) if folder.exists() else ():
                try:
                    data = pq.read_table(p)
                except Exception:  # a corrupt file is left for the reader to skip with a warning
                    continue
                keep = pc.less(data["step"], step)
                n_keep = pc.sum(keep).as_py() or 0
                if n_keep == data.num_rows:
                    continue
                removed += data.num_rows - n_keep
                if n_keep:
                    self._write_atomic(data.filter(keep), p)
                else:
                    p.unlink()
                    self._small[table] = [e for e in self._small[table] if e[2] != p]
        return removed

    def _repair(self) -> list[str]:
        """What a kill left in this rank's folders (temporary files, small files already merged, legacy
        overlapping merges) is cleaned up before anything new is written; see tokengrad.read.layout."""
        done = []
        for table in schema.TABLES:
            folder = self.run_dir / schema.rank_dir(table, self.rank)
            try:
                done += [f"{table}/{line}" for line in layout.repair(folder, self._write_atomic)]
            except OSError as err:  # e.g. a read-only disk: the reader resolves the same files anyway
                warnings.warn(
                    f"tokengrad writer: could not tidy {folder}: {err}", RuntimeWarning, stacklevel=2
                )
        return done

    def _next_sequence(self) -> int:
        """Continue after the highest sequence number already on disk for this rank (resumed runs)."""
        last = -1
        for table in schema.TABLES:
            for _, end, _ in layout.entries(self.run_dir / schema.rank_dir(table, self.rank)):
                last = max(last, end)
        return last + 1

    def _existing_small(self, table: str) -> list[tuple[int, int, Path]]:
        """A resumed run's uncompacted commits (after _repair, none of them is inside a merged file)."""
        found = layout.entries(self.run_dir / schema.rank_dir(table, self.rank))
        return [e for e in found if e[0] == e[1]]
