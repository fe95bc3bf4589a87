"""Read a run directory: meta, small tables as pandas, tokens through DuckDB. No torch.

    run = load_run("runs/tr_grpo")
    run.steps                                   # pandas DataFrame, all ranks merged
    run.tokens(columns=["step", "prob", "coef"], steps=(100, 200), where="in_loss")
    run.sql("SELECT step, sum(logit_grad_norm) FROM tokens GROUP BY step")

Files are listed per rank and resolved by their sequence ranges (a compacted file supersedes the small
files it covers, see tokengrad.read.layout), so reading while a run is being written or compacted is
consistent. A file compacted away between listing and reading makes the read start again from a fresh
listing (at most READ_ATTEMPTS times). A corrupt or truncated file, one with a corrupt page behind a valid
footer, and one whose column types clash with the run's other files are skipped with a warning naming it
and listed in `Run.unreadable` (tokengrad.read.unreadable says what each one takes away). A file with no
rows is left out of every read: it holds nothing, and 5,000 of them cost no more than one.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from functools import cached_property
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tokengrad import schema
from tokengrad.read import duck, layout, remote
from tokengrad.read.file_check import FileCheck, FileFacts, claimed_twice
from tokengrad.read.meta_file import count_rows, is_run_dir, read_meta, rows_dropped, run_name
from tokengrad.read.unreadable import Unreadable, unreadable

READ_ATTEMPTS = 5  # listings tried while compaction keeps replacing files under a reader
WARNED = 20  # skipped files told as Python warnings one by one; the rest in one more (all in `unreadable`)


class SchemaVersionError(ValueError):
    """The run was written by a newer tokengrad than this one."""


def list_runs(root: str | os.PathLike, follow_links_out: bool = False) -> list[str]:
    """Run directories (those holding meta.json) at or directly below `root`, sorted by name. A symlink
    whose target lies outside `root` is skipped unless `follow_links_out`; so is a hidden folder (an
    import's staging folder, tokengrad.importers.staging, holds a copy of its run until it is moved)."""
    root = Path(root)
    if is_run_dir(root):
        return [str(root)]
    if not root.is_dir():
        return []
    real = root.resolve()
    return sorted(
        str(p)
        for p in root.iterdir()
        if not p.name.startswith(".")
        and is_run_dir(p)
        and (follow_links_out or p.resolve().is_relative_to(real))
    )


def with_meta_name(folder: str, meta_name: str | None) -> str:
    """'folder', or 'folder (run_name NAME)' where meta.json names the run otherwise (a copied folder)."""
    return (
        folder
        if not meta_name or meta_name == folder.rsplit("/", 1)[-1]
        else f"{folder} (run_name {meta_name})"
    )


def load_run(path: str | os.PathLike, follow_links_out: bool = False) -> "Run":
    """Open a run directory; raises FileNotFoundError / SchemaVersionError with the reason. A data file
    (or table folder) that links outside the run folder is skipped with a warning unless
    `follow_links_out`."""
    return Run(path, follow_links_out)


class Run:
    """One run directory, open for reading: its meta.json (`meta`, read once by
    tokengrad.read.meta_file), its small tables as pandas (`steps`, `layers`, `buckets`, `samples`,
    `evals`, `table(name)`) and every table through DuckDB (`sql`, `tokens`), over the files
    tokengrad.read.layout resolves. A file it cannot use is skipped, named in `warnings` and listed in
    `unreadable` (`check_files()` looks at every table's footers at once).

    Args:
        path: the run folder (holding meta.json), or its URL in a bucket (`s3://bucket/prefix/run`: read
            from a local copy brought up to date on open, tokengrad.read.remote).
        follow_links_out: read data files and meta.json that are symlinks leading outside the folder
            (skipped with a warning, or refused for meta.json, by default).

    Raises FileNotFoundError without meta.json, MetaError when it is damaged, SchemaVersionError for a
    run written by a newer tokengrad.
    """

    def __init__(self, path: str | os.PathLike, follow_links_out: bool = False):
        self.url = remote.parse_url(path)  # None for a local folder
        self.path = remote.local_copy(path, tables=())  # a bucket's tables: each when first read
        self._fetched: set[str] = set()
        if self.url is not None and not (self.path / schema.META_FILE).is_file():
            raise FileNotFoundError(f"{self.url}: no run there (no {schema.META_FILE} under it)")
        self._inside = None if follow_links_out else self.path.resolve()
        self.meta: dict = read_meta(self.path, follow_links_out)
        version = self.meta.get("schema_version")
        if not isinstance(version, int) or version > schema.SCHEMA_VERSION:  # read_meta checked the type
            raise SchemaVersionError(
                f"{self.path} uses run-format schema version {version!r}; this tokengrad reads versions "
                f"<= {schema.SCHEMA_VERSION}. Upgrade tokengrad to read it."
            )
        self.schema_version: int = version
        self.warnings: list[str] = []
        self._told: set[str] = set()
        self._unreadable: dict[Path, Unreadable] = {}
        self._check = FileCheck()
        self._listed: dict[str, list[Path]] = {}
        self._lists: dict[str, tuple] = {}  # table -> (its folders' stamp, the parts listed under it)

    @property
    def name(self) -> str:
        """The run's identity: its folder's name. A copied folder is another run, so cards, links and URL
        state that name it open this folder, whatever meta.json says (meta_name)."""
        return self.path.name

    @property
    def meta_name(self) -> str | None:
        """The name meta.json gives the run (run_name), None when it has none."""
        return run_name(self.meta)

    @property
    def label(self) -> str:
        """The folder name, with meta.json's name beside it where they differ: 'copy (run_name lab_grpo)'."""
        return with_meta_name(self.name, self.meta_name)

    @property
    def rank_status(self) -> list[dict]:
        folder = self.path / schema.RANKS_DIR
        out = []
        for p in sorted(folder.glob("rank*.json")) if folder.exists() else ():
            try:
                status = json.loads(p.read_text())
            except (OSError, ValueError) as err:
                self._warn(f"skipped unreadable status file {p}: {err}")
                continue
            if isinstance(status, dict):
                out.append(status)
            else:
                self._warn(f"skipped status file {p}: it holds a {type(status).__name__}, not an object")
        return out

    @property
    def rows_dropped(self) -> int:
        status = self.rank_status
        if status:
            return sum(count_rows(s.get("rows_dropped")) for s in status)
        return rows_dropped(self.meta)

    # ---- files ----------------------------------------------------------------------------------
    @property
    def unreadable(self) -> list[Unreadable]:
        """The data files skipped so far because they cannot be read (of the tables read so far; after
        `check_files()`, of every table), in the order met."""
        return list(self._unreadable.values())

    def check_files(self) -> list[Unreadable]:
        """Check every table's files (their footers) and return every file that cannot be read."""
        for table in schema.TABLES:
            self.parts(table)
        return self.unreadable

    def parts(self, table: str) -> list[layout.Part]:
        """The table's files to read, all ranks, resolved (see tokengrad.read.layout); unusable ones skipped
        with a warning, those without rows left out."""
        schema.column_names(table)  # validates the table name
        if self.url is not None and table not in self._fetched:  # a run in a bucket: its files, once
            remote.local_copy(str(self.url), tables=(table,))
            self._fetched.add(table)
        for _ in range(READ_ATTEMPTS):
            stamp = layout.folders_stamp(self.path, table)
            cached = self._lists.get(table)
            if stamp is not None and cached is not None and cached[0] == stamp:
                return cached[1]  # no file added, renamed or removed since: the same parts
            self._folders: dict[Path, bool] = {}
            listed = layout.table_parts(self.path, table)
            usable = [self._usable(table, p.path) for p in listed]
            if None not in usable:  # none vanished while checked (else a merge replaced it: list again)
                kept = [(p, facts) for p, facts in zip(listed, usable) if facts and facts.rows]
                twice = claimed_twice([(p.path, facts) for p, facts in kept])
                for path, why in twice.items():
                    self._skip(path, why, keep_lists=True)
                out = [p for p, _ in kept if p.path not in twice]
                self._listed[table] = [p.path for p in out]
                self._lists[table] = (stamp, out)
                return out
        raise OSError(
            f"could not list {table} of {self.path}: its files kept changing over {READ_ATTEMPTS} listings"
        )

    def files(self, table: str) -> list[str]:
        """Readable parquet files of a table, all ranks, de-duplicated; unusable ones skipped with a
        warning."""
        return [str(p.path) for p in self.parts(table)]

    def _usable(self, table: str, p: Path) -> FileFacts | bool | None:
        """The file's facts when it can be read with the others, False when not, None if it vanished
        (compacted away)."""
        why = self._outside(p)
        try:
            st = p.stat()
        except FileNotFoundError:
            return None
        except OSError as err:  # a symlink loop, a permission
            why = why or f"{type(err).__name__}: {err.strerror}"
        if not why:
            try:
                facts, why = self._check(table, p, st)
            except FileNotFoundError:
                return None
            if facts is not None:
                return facts
        self._skip(p, why)
        return False

    def _skip(self, p: Path, why: str, keep_lists: bool = False) -> None:
        """Say a file is skipped (a warning, the first WARNED one by one) and list it in `unreadable`."""
        corrupt = why.startswith("corrupt: ")
        self._warn(f"skipped corrupt file {p}: {why[9:]}" if corrupt else f"skipped file {p}: {why}")
        if p not in self._unreadable:
            self._unreadable[p] = unreadable(p, why)
        if not keep_lists:
            self._lists.clear()  # a file found damaged while read: list again without it

    def _outside(self, p: Path) -> str | None:
        """Why a file may not be read because of where it really is (a link out of the run folder)."""
        if self._inside is None:
            return None
        try:  # a plain file in a folder inside the run is inside (one lstat, the folder resolved once)
            if not p.is_symlink() and self._folder_inside(p.parent):
                return None
            real = p.resolve()
        except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (Python < 3.13)
            return f"it cannot be resolved ({err})"
        return None if real.is_relative_to(self._inside) else f"it links outside the run folder, to {real}"

    def _folder_inside(self, folder: Path) -> bool:
        """Whether a rank folder really lies inside the run folder (asked once per folder and listing)."""
        if folder not in self._folders:
            self._folders[folder] = folder.resolve().is_relative_to(self._inside)
        return self._folders[folder]

    def _mark_bad(self, p: Path, err: BaseException) -> None:
        try:
            st = p.stat()
        except OSError:
            return
        why = f"corrupt: {type(err).__name__}: {err}"
        self._check.forget(p, st, why)
        self._skip(p, why)

    def _find_corrupt(self, message: str) -> int:
        """Read listed files in full, with page checksums, and mark the damaged ones; files named in
        `message` (the reader's error) first. Returns how many were found."""
        listed = [p for paths in self._listed.values() for p in paths]
        named = [p for p in listed if str(p) in message or p.name in message]
        found = 0
        for p in named or listed:
            try:
                pq.read_table(p, page_checksum_verification=True)
            except FileNotFoundError:
                continue
            except Exception as err:  # noqa: BLE001 - decoding errors come in many types
                self._mark_bad(p, err)
                found += 1
        return found

    def _vanished(self) -> bool:
        return any(not p.exists() for paths in self._listed.values() for p in paths)

    def _warn(self, msg: str) -> None:
        if msg in self._told:
            return
        self._told.add(msg)
        self.warnings.append(msg)
        if len(self.warnings) <= WARNED:
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
        elif len(self.warnings) == WARNED + 1:
            more = f"{self.path}: more files skipped than the {WARNED} told; Run.warnings lists them all"
            warnings.warn(more, RuntimeWarning, stacklevel=4)

    # ---- small tables -----------------------------------------------------------------------------
    def table(self, table: str) -> pd.DataFrame:
        """A whole table as pandas (meant for the small tables); missing table -> empty frame with columns."""
        for _ in range(READ_ATTEMPTS):
            frames = self._read_parts(table)
            if frames is not None:
                break
        else:
            raise OSError(
                f"could not read {table} of {self.path}: its files kept being replaced "
                f"over {READ_ATTEMPTS} listings"
            )
        if not frames:
            return schema.arrow_schema(table).empty_table().to_pandas()
        df = pa.concat_tables(frames, promote_options="permissive").to_pandas()
        for col in schema.column_names(table):  # columns added after the run's schema version: null
            if col not in df.columns:
                df[col] = None
        keys = [k for k in ("step", "rank", "update_id", "sample_id") if k in df.columns]
        return df.sort_values(keys, kind="stable").reset_index(drop=True)

    def _read_parts(self, table: str) -> list[pa.Table] | None:
        """Every part of the table as Arrow; None when a listed file vanished (list again)."""
        frames = []
        for part in self.parts(table):
            try:
                data = pq.read_table(part.path, page_checksum_verification=True)
            except FileNotFoundError:
                return None
            except Exception as err:  # noqa: BLE001 - a damaged page: skip the file, say which
                self._mark_bad(part.path, err)
                continue
            frames.append(data.filter(layout.keep_mask(data, part.exclude)) if part.exclude else data)
        return frames

    steps = cached_property(lambda self: self.table("steps"))
    layers = cached_property(lambda self: self.table("layers"))
    buckets = cached_property(lambda self: self.table("buckets"))
    samples = cached_property(lambda self: self.table("samples"))
    evals = cached_property(lambda self: self.table("evals"))

    # ---- tokens (DuckDB) -------------------------------------------------------------------------
    def connect(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection (its own database) with one view per table over this run's files."""
        con = duckdb.connect()
        self._create_views(con)
        return con

    def _create_views(self, con: duckdb.DuckDBPyConnection, tables=schema.TABLES) -> None:
        for table in tables:
            parts = self.parts(table)
            if parts:
                con.execute(f"CREATE TEMP VIEW {table} AS {duck.union(parts)}")
                if self.schema_version < schema.SCHEMA_VERSION:
                    duck.add_missing_columns(con, table, duck.union(parts))
            else:
                cols = ", ".join(
                    f"CAST(NULL AS {duck.duck_type(c.type)}) AS {c.name}" for c in schema.TABLES[table]
                )
                con.execute(f"CREATE TEMP VIEW {table} AS SELECT {cols} WHERE false")

    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        """Run a DuckDB query over the run's tables. A file that vanished (compaction) makes it list again;
        a damaged one is found, skipped with a warning, and the query runs again; at most READ_ATTEMPTS.
        The query runs on a cursor of the process's shared database whose views over the run are temporary:
        read-only queries, as everywhere in tokengrad (objects a query creates would outlive it)."""
        last: Exception | None = None
        for _ in range(READ_ATTEMPTS):
            con = duck.cursor()
            try:
                self._create_views(con, _tables_in(query))  # DuckDB opens the files here already
                return con.execute(query, params or []).df()
            except duckdb.Error as err:
                last = err
                if isinstance(err, duck.QUERY_ERRORS) or not (
                    self._vanished() or self._find_corrupt(str(err))
                ):
                    raise
            finally:
                con.close()
        raise OSError(
            f"could not read {self.path}: its files kept changing over {READ_ATTEMPTS} "
            f"listings ({type(last).__name__}: {last})"
        )

    def tokens(
        self,
        columns: list[str] | None = None,
        steps: tuple[int, int] | None = None,
        where: str | None = None,
        limit: int | None = None,
    ) -> pd.DataFrame:
        """Token rows filtered in DuckDB (step range inclusive, optional SQL predicate), as pandas."""
        cols = ", ".join(f'"{c}"' for c in columns) if columns else "*"
        conds, params = [], []
        if steps is not None:
            conds.append("step BETWEEN ? AND ?")
            params += [int(steps[0]), int(steps[1])]
        if where:
            conds.append(f"({where})")
        q = f"SELECT {cols} FROM tokens" + (f" WHERE {' AND '.join(conds)}" if conds else "")
        q += " ORDER BY step, rank, pass_id, sample_id, position" if not columns or _has_keys(columns) else ""
        q += f" LIMIT {int(limit)}" if limit else ""
        return self.sql(q, params)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, schema_version={self.schema_version})"


def _tables_in(query: str) -> list[str]:
    """The run's tables a query names (a view costs its files' opening; a word that only looks like a
    table name costs one view too many, never a missing one)."""
    return [t for t in schema.TABLES if re.search(rf"\b{t}\b", query, re.IGNORECASE)]


def _has_keys(columns: list[str]) -> bool:
    return {"step", "rank", "pass_id", "sample_id", "position"} <= set(columns)
