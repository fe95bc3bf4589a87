"""The data files of a run: naming, listing and how overlapping sequence ranges resolve. No torch.

Each table of each rank is a folder of files `s{first:08d}-{last:08d}.parquet`, the rows of the writer's
commits first..last (see tokengrad.schema). The writer commits one small file per commit and merges runs of
small files into one file with the covering range; every file is written to a temporary name and renamed,
so a file that has its final name is complete. A process killed at the wrong moment can still leave

* temporary files (`.NAME.tmp`): never read, removed when the rank's writer opens again;
* small files whose merged file exists (killed between writing the merge and removing its parts): they are
  *redundant*, because a kept file's range contains theirs. Readers ignore them; the writer removes them;
* (only from a run written by an older tokengrad, whose next compaction took such a redundant file into a
  new merge) two files whose ranges overlap without one containing the other. They resolve the same way
  everywhere: wider files first, then the lower range; a file that partially overlaps a file already kept
  is read without the rows of the kept file's *steps*. Steps increase with the commit number on every rank
  (the recorder refuses a step that does not), so this reads every step once. The writer's `repair()`
  rewrites such a file to its non-overlapping range, so the next open leaves only disjoint files.

Resolution is a pure function of the file names (and, for partial overlaps, of the steps in the files), so
the reader, the writer and a reader racing a compaction all agree on which rows a run holds.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokengrad import schema

TMP_SUFFIX = ".tmp"
QUIET_S = 2  # seconds a folder must be unchanged before its modification time vouches for a listing


@dataclass(frozen=True, kw_only=True)
class Part:
    """One data file to read: its sequence range and the step ranges [lo, hi] of its rows to leave out."""

    path: Path
    first: int
    last: int
    exclude: tuple[tuple[int, int], ...] = ()


def tmp_path(path: Path) -> Path:
    """Where `path` is written before its atomic rename (a dot file: never listed as data)."""
    return path.with_name(f".{path.name}{TMP_SUFFIX}")


def entries(folder: Path) -> list[tuple[int, int, Path]]:
    """(first, last, path) of every data file in one rank folder of a table."""
    out = []
    for p in folder.glob("s*.parquet") if folder.is_dir() else ():
        rng = schema.parse_file_name(p.name)
        if rng:
            out.append((rng[0], rng[1], p))
    return out


def folder_rank(name: str) -> int | None:
    """The rank a folder named rankRRR (or a status file rankRRR.json's stem) is of; None for another name."""
    return int(name[4:]) if name.startswith("rank") and name[4:].isdigit() else None


def rank_folders(run_dir: Path, table: str) -> list[Path]:
    base = Path(run_dir) / table
    return sorted(p for p in base.glob("rank*") if p.is_dir()) if base.is_dir() else []


def folders_stamp(run_dir: Path, table: str) -> tuple | None:
    """The modification times of a table's folder and its rank folders: equal stamps mean no file was
    added, renamed or removed in between (every write renames a file into place). None when a folder
    changed within QUIET_S of now, because a change in the same clock tick would leave its time as it was
    (git's "racy" entries): only a folder quiet for longer vouches for a listing."""
    base = Path(run_dir) / table
    try:
        stamp = tuple((p.name, p.stat().st_mtime_ns) for p in [base, *rank_folders(run_dir, table)])
    except OSError:  # no such table, or a folder removed while stamped
        return None
    newest = max(t for _, t in stamp)
    return stamp if newest < time.time_ns() - QUIET_S * 1e9 else None


def data_files(run_dir: Path, table: str) -> list[Path]:
    """Every data file of a table as it lies, rank by rank in name order: redundant files included, the
    writer's temporary dot files never."""
    return [p for folder in rank_folders(run_dir, table) for p in sorted(folder.glob("s*.parquet"))]


def rank_status_files(run_dir: Path) -> list[Path]:
    """The status file each rank's recorder writes when it closes (ranks/rankRRR.json), in rank order."""
    status = Path(run_dir) / schema.RANKS_DIR
    return sorted(status.glob("rank*.json")) if status.is_dir() else []


def run_files(run_dir: Path, tables: tuple[str, ...] | None = None) -> list[Path]:
    """meta.json, the ranks' status files and the data files of `tables` (every table when None): the
    files whose changes a reader's cache watches (a new step file, a compaction, a rewritten meta.json)."""
    base = Path(run_dir)
    paths = [base / schema.META_FILE, *rank_status_files(base)]
    return paths + [p for t in (schema.TABLES if tables is None else tables) for p in data_files(base, t)]


def step_range(path: Path) -> tuple[int, int] | None:
    """(min, max) of the `step` column, from the footer's statistics when present; None if unreadable."""
    try:
        meta = pq.read_metadata(path)
        lo = hi = None
        idx = meta.schema.to_arrow_schema().get_field_index("step")
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(idx).statistics if idx >= 0 else None
            if st is None or not st.has_min_max:
                mm = pc.min_max(pq.read_table(path, columns=["step"])["step"]).as_py()
                return (mm["min"], mm["max"]) if mm["min"] is not None else None
            lo = st.min if lo is None else min(lo, st.min)
            hi = st.max if hi is None else max(hi, st.max)
        return (int(lo), int(hi)) if lo is not None else None
    except Exception:  # noqa: BLE001 - an unreadable file is reported by the reader that skips it
        return None


def resolve(found: list[tuple[int, int, Path]]) -> tuple[list[Part], list[Path]]:
    """(parts to read in sequence order, redundant files) of one rank folder; see the module docstring.

    No kept range contains another (a wider one is kept first; an equal one is contained), so ordered by
    `first` the kept ranges are ordered by `last` too: the one kept range that may contain a file is the
    last one starting at or before it, and the kept ranges it overlaps are contiguous. That makes it
    O(n log n) in the files of a folder (a folder of 5,000 small files resolves in milliseconds)."""
    kept: list[Part] = []  # sorted by first (and so by last)
    firsts: list[int] = []
    redundant: list[Path] = []
    for first, last, p in sorted(found, key=lambda e: (-(e[1] - e[0]), e[0], e[2].name)):
        at = bisect.bisect_right(firsts, first)
        if at and kept[at - 1].last >= last:
            redundant.append(p)
            continue
        lo, hi = at, bisect.bisect_right(firsts, last)  # kept[lo:hi] start inside [first, last]
        while lo and kept[lo - 1].last >= first:  # and those starting before it that reach into it
            lo -= 1
        ranges = tuple(r for r in (step_range(k.path) for k in kept[lo:hi]) if r is not None)
        kept.insert(at, Part(path=p, first=first, last=last, exclude=ranges))
        firsts.insert(at, first)
    return kept, sorted(redundant)


def table_parts(run_dir: Path, table: str) -> list[Part]:
    """Every rank's parts of a table, rank by rank, each rank in sequence order."""
    return [part for folder in rank_folders(run_dir, table) for part in resolve(entries(folder))[0]]


def keep_mask(data, exclude: tuple[tuple[int, int], ...]):
    """Boolean mask of the rows of `data` (a pyarrow Table) outside every excluded step range."""
    mask = None
    for lo, hi in exclude:
        outside = pc.or_(pc.less(data["step"], lo), pc.greater(data["step"], hi))
        mask = outside if mask is None else pc.and_(mask, outside)
    return mask


def repair(folder: Path, write) -> list[str]:
    """Make one rank folder's files disjoint (the writer, on open): remove temporary and redundant files,
    rewrite partially overlapping files to their own range. `write(table, path)` writes a file atomically.
    Returns what was done, one line each. Idempotent: a kill half way leaves files the next call fixes."""
    done = []
    for tmp in folder.glob(f".*{TMP_SUFFIX}") if folder.is_dir() else ():
        tmp.unlink(missing_ok=True)
    parts, redundant = resolve(entries(folder))
    for p in redundant:
        p.unlink(missing_ok=True)
        done.append(f"removed {p.name} (its rows are in a merged file)")
    for part in parts:
        if not part.exclude:
            continue
        others = [k for k in parts if k is not part and k.first <= part.last and part.first <= k.last]
        first = max([part.first] + [k.last + 1 for k in others if k.first <= part.first])
        last = min([part.last] + [k.first - 1 for k in others if k.last >= part.last])
        data = pq.read_table(part.path)
        rest = data.filter(keep_mask(data, part.exclude))
        if first <= last and rest.num_rows:
            write(rest, part.path.with_name(schema.file_name(first, last)))
        part.path.unlink()
        done.append(f"rewrote {part.path.name} without the steps another file holds")
    return done
