"""Read a run directory: meta, small tables as pandas, tokens through DuckDB. No torch.

    run = load_run("runs/tr_grpo")
    run.steps                                   # pandas DataFrame, all ranks merged
    run.tokens(columns=["step", "prob", "coef"], steps=(100, 200), where="in_loss")
    run.sql("SELECT step, sum(logit_grad_norm) FROM tokens GROUP BY step")

Files are listed per rank and de-duplicated by their sequence ranges (a compacted file supersedes the
small files it covers, see schema.py), so reading while a run is being written or compacted is consistent.
A corrupt or truncated file is skipped with a warning naming it.
"""

from __future__ import annotations

import json
import os
import warnings
from functools import cached_property
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tokengrad import schema


class SchemaVersionError(ValueError):
    """The run was written by a newer tokengrad than this one."""


def list_runs(root: str | os.PathLike) -> list[str]:
    """Run directories (those holding meta.json) at or directly below `root`, sorted by name."""
    root = Path(root)
    if (root / schema.META_FILE).exists():
        return [str(root)]
    if not root.is_dir():
        return []
    return sorted(str(p) for p in root.iterdir() if (p / schema.META_FILE).exists())


def load_run(path: str | os.PathLike) -> "Run":
    """Open a run directory; raises FileNotFoundError / SchemaVersionError with the reason."""
    return Run(path)


def _dedupe(entries: list[tuple[int, int, Path]]) -> list[Path]:
    """Keep files whose sequence range no other kept file contains (widest ranges win)."""
    kept: list[tuple[int, int, Path]] = []
    for first, last, p in sorted(entries, key=lambda e: (-(e[1] - e[0]), e[0])):
        if not any(a <= first and last <= b for a, b, _ in kept):
            kept.append((first, last, p))
    return [p for _, _, p in sorted(kept, key=lambda e: e[0])]


class Run:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        meta_path = self.path / schema.META_FILE
        if not meta_path.exists():
            raise FileNotFoundError(f"{self.path} is not a tokengrad run: {schema.META_FILE} is missing")
        try:
            self.meta: dict = json.loads(meta_path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{meta_path} is not valid JSON ({err}); the run metadata is damaged") from None
        if not isinstance(self.meta, dict):
            raise ValueError(f"{meta_path} must hold a JSON object, got {type(self.meta).__name__}")
        version = self.meta.get("schema_version")
        if not isinstance(version, int) or version > schema.SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path} uses run-format schema version {version!r}; this tokengrad reads versions "
                f"<= {schema.SCHEMA_VERSION}. Upgrade tokengrad to read it.")
        self.warnings: list[str] = []
        self._valid: dict[str, list[str]] = {}

    @property
    def name(self) -> str:
        return self.meta.get("run_name") or self.path.name

    @property
    def rank_status(self) -> list[dict]:
        folder = self.path / schema.RANKS_DIR
        out = []
        for p in sorted(folder.glob("rank*.json")) if folder.exists() else ():
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError) as err:
                self._warn(f"skipped unreadable status file {p}: {err}")
        return out

    @property
    def rows_dropped(self) -> int:
        status = self.rank_status
        if status:
            return sum(sum(s.get("rows_dropped", {}).values()) for s in status)
        return sum(self.meta.get("rows_dropped", {}).values())

    # ---- files ----------------------------------------------------------------------------------
    def files(self, table: str) -> list[str]:
        """Readable parquet files of a table, all ranks, de-duplicated; corrupt ones skipped with a
        warning."""
        schema.column_names(table)  # validates the table name
        out = []
        base = self.path / table
        for rank_dir in sorted(base.glob("rank*")) if base.exists() else ():
            entries = []
            for p in rank_dir.glob("s*.parquet"):
                rng = schema.parse_file_name(p.name)
                if rng:
                    entries.append((rng[0], rng[1], p))
            out += [str(p) for p in _dedupe(entries) if self._readable(p)]
        return out

    def _readable(self, p: Path) -> bool:
        key = f"{p}:{p.stat().st_size if p.exists() else -1}"
        if key in self._valid:
            return True
        try:
            pq.read_metadata(p)
        except FileNotFoundError:  # compacted away between listing and reading
            return False
        except Exception as err:
            self._warn(f"skipped corrupt file {p}: {type(err).__name__}: {err}")
            return False
        self._valid[key] = []
        return True

    def _warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    # ---- small tables -----------------------------------------------------------------------------
    def table(self, table: str) -> pd.DataFrame:
        """A whole table as pandas (meant for the small tables); missing table -> empty frame with columns."""
        frames = []
        for f in self.files(table):
            try:
                frames.append(pq.read_table(f))
            except FileNotFoundError:
                return self.table(table)  # a compaction replaced the file: list again
            except Exception as err:
                self._warn(f"skipped corrupt file {f}: {type(err).__name__}: {err}")
        if not frames:
            return schema.arrow_schema(table).empty_table().to_pandas()
        df = pa.concat_tables(frames, promote_options="permissive").to_pandas()
        for col in schema.column_names(table):  # columns added after the run's schema version: null
            if col not in df.columns:
                df[col] = None
        keys = [k for k in ("step", "rank", "update_id", "sample_id") if k in df.columns]
        return df.sort_values(keys, kind="stable").reset_index(drop=True)

    steps = cached_property(lambda self: self.table("steps"))
    layers = cached_property(lambda self: self.table("layers"))
    buckets = cached_property(lambda self: self.table("buckets"))
    samples = cached_property(lambda self: self.table("samples"))
    evals = cached_property(lambda self: self.table("evals"))

    # ---- tokens (DuckDB) -------------------------------------------------------------------------
    def connect(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with one view per table over this run's files."""
        con = duckdb.connect()
        for table in schema.TABLES:
            files = self.files(table)
            if files:
                lst = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
                con.execute(f"CREATE VIEW {table} AS SELECT * FROM read_parquet([{lst}], union_by_name=true)")
                if self.meta.get("schema_version", schema.SCHEMA_VERSION) < schema.SCHEMA_VERSION:
                    _add_missing_columns(con, table, lst)
            else:
                cols = ", ".join(
                    f"CAST(NULL AS {_duck_type(c.type)}) AS {c.name}" for c in schema.TABLES[table]
                )
                con.execute(f"CREATE VIEW {table} AS SELECT {cols} WHERE false")
        return con

    def sql(self, query: str, params: list | None = None) -> pd.DataFrame:
        con = self.connect()
        try:
            return con.execute(query, params or []).df()
        finally:
            con.close()

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
        return f"Run({str(self.path)!r}, schema_version={self.meta.get('schema_version')})"


def _add_missing_columns(con: duckdb.DuckDBPyConnection, table: str, files: str) -> None:
    """An older run's view gets the columns added since its schema version, as nulls."""
    have = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
    missing = [c for c in schema.TABLES[table] if c.name not in have]
    if missing:
        extra = ", ".join(f"CAST(NULL AS {_duck_type(c.type)}) AS {c.name}" for c in missing)
        con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT *, {extra} "
                    f"FROM read_parquet([{files}], union_by_name=true)")


def _has_keys(columns: list[str]) -> bool:
    return {"step", "rank", "pass_id", "sample_id", "position"} <= set(columns)


_DUCK = {
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.string(): "VARCHAR",
}


def _duck_type(t: pa.DataType) -> str:
    return _DUCK.get(t, "VARCHAR")
