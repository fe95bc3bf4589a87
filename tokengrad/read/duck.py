"""The DuckDB side of reading a run: the process's one in-memory database, and views over Parquet parts.

    con = cursor()                           # a cursor on the shared database (well under 1 ms)
    con.execute(f"CREATE TEMP VIEW tokens AS {union(parts)}")
    duck_type(pa.float32())                  # 'FLOAT'

tokengrad.read.runs.Run.sql runs every query on a cursor from here, with temporary views built by
`union`; Run.connect gives a caller a database of its own with the same views.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import duckdb
import pyarrow as pa

from tokengrad import schema
from tokengrad.read import layout

# DuckDB errors of a query's own mistakes; any other DuckDB error may come from a vanished or damaged file
QUERY_ERRORS = (
    duckdb.ParserException,
    duckdb.BinderException,
    duckdb.CatalogException,
    duckdb.SyntaxException,
)

_DATABASE_LOCK = threading.Lock()
_DATABASE: duckdb.DuckDBPyConnection | None = None  # the process's shared in-memory database


def cursor() -> duckdb.DuckDBPyConnection:
    """A new connection to the process's one in-memory DuckDB database (for Run.sql). Opening a database
    costs ~20 ms of CPU, a cursor on an open one well under 1 ms; the dashboard's first page runs dozens of
    queries. Each cursor holds its own temporary views, so queries on several runs and threads never see
    each other's; local files are read anew by every query (DuckDB caches no local file data or Parquet
    metadata unless told to). A forked child opens its own database (_after_fork)."""
    global _DATABASE
    with _DATABASE_LOCK:
        if _DATABASE is None:
            con = duckdb.connect()
            for setting in ("enable_external_file_cache", "parquet_metadata_cache"):
                try:  # the defaults already; said here so that reads stay uncached if they change
                    con.execute(f"SET {setting} = false")
                except duckdb.Error:  # a DuckDB without the setting
                    pass
            _DATABASE = con
        return _DATABASE.cursor()


def _after_fork() -> None:
    """In a forked child: forget the parent's database without closing it. Its worker threads did not
    follow the fork, and closing it (or letting the interpreter free it at exit) would wait for them or
    abort; so it is kept alive for good, and the child's first query opens a database of its own."""
    global _DATABASE, _DATABASE_LOCK
    _DATABASE_LOCK = threading.Lock()  # another thread may have held it at the fork
    if _DATABASE is not None:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_DATABASE))  # never freed, not even at exit
        _DATABASE = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def sql_path(p: Path) -> str:
    return "'" + str(p).replace("'", "''") + "'"


def union(parts: list[layout.Part]) -> str:
    """One SELECT over the parts: whole files in one read_parquet, a partially overlapping one without the
    steps another file holds."""
    whole = [p for p in parts if not p.exclude]
    selects = (
        [f"SELECT * FROM read_parquet([{', '.join(sql_path(p.path) for p in whole)}], union_by_name=true)"]
        if whole
        else []
    )
    for p in (p for p in parts if p.exclude):
        keep = " AND ".join(f"NOT (step BETWEEN {int(lo)} AND {int(hi)})" for lo, hi in p.exclude)
        selects.append(f"SELECT * FROM read_parquet({sql_path(p.path)}) WHERE {keep}")
    return " UNION ALL BY NAME ".join(selects)


def add_missing_columns(con: duckdb.DuckDBPyConnection, table: str, source: str) -> None:
    """An older run's view gets the columns added since its schema version, as nulls."""
    have = {row[0] for row in con.execute(f"DESCRIBE {table}").fetchall()}
    missing = [c for c in schema.TABLES[table] if c.name not in have]
    if missing:
        extra = ", ".join(f"CAST(NULL AS {duck_type(c.type)}) AS {c.name}" for c in missing)
        con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS SELECT *, {extra} FROM ({source})")


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


def duck_type(t: pa.DataType) -> str:
    return _DUCK.get(t, "VARCHAR")
