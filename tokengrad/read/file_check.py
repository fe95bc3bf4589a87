"""Whether a data file can be read with a run's other files, from its footer alone. No torch.

    check = FileCheck()
    facts, why = check(table, path)     # (FileFacts, None) for a usable file, (None, "reason") otherwise

The footer (Parquet metadata) is read once per file version (path, size, mtime): a run of 5,000 small files
pays it once, and a file rewritten in place is checked again. A usable file's facts say how many rows it
holds (a file with none is left out of every read) and which ranks its `rank` column names, from the
footer's statistics, so a folder that holds another rank's rows is found without reading them.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tokengrad import schema
from tokengrad.read import layout


@dataclass(frozen=True)
class FileFacts:
    """What the footer of a usable file says: its row count and the min and max of its rank column (None
    when the footer keeps no statistics for it)."""

    rows: int
    ranks: tuple[int, int] | None


class FileCheck:
    """The footer check of a run's files, remembered per file version; the run's extra-column kinds."""

    def __init__(self):
        self._seen: dict[tuple, tuple[FileFacts | None, str | None]] = {}
        self._types: dict[str, dict[str, str]] = {}  # table -> extra column -> type class of the run

    def __call__(self, table: str, path: Path, st: os.stat_result) -> tuple[FileFacts | None, str | None]:
        """(facts, None) when the file can be read with the others, else (None, why). Raises
        FileNotFoundError when the file vanished (compacted away)."""
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._seen:
            try:
                self._seen[key] = self._footer(table, path)
            except FileNotFoundError:
                raise
            except Exception as err:  # noqa: BLE001 - any unreadable footer is a corrupt file
                self._seen[key] = (None, f"corrupt: {type(err).__name__}: {err}")
        return self._seen[key]

    def _footer(self, table: str, path: Path) -> tuple[FileFacts | None, str | None]:
        with pq.ParquetFile(path) as pf:
            meta = pf.metadata
            if not meta.num_columns:
                return None, "it has no columns"
            if not meta.num_rows:  # read by nothing, so its column types cannot clash
                return FileFacts(rows=0, ranks=None), None
            file_schema = pf.schema_arrow
        clash = self._type_clash(table, file_schema)
        return (None, clash) if clash else (FileFacts(meta.num_rows, _rank_range(meta, file_schema)), None)

    def forget(self, path: Path, st: os.stat_result, why: str) -> None:
        """Mark a file whose footer read but whose pages did not (a corrupt page) as unusable."""
        self._seen[(str(path), st.st_size, st.st_mtime_ns)] = (None, why)

    def _type_clash(self, table: str, file_schema: pa.Schema) -> str | None:
        """Why the file's column types cannot be read together with the run's other files, or None. Fixed
        columns must have the schema's type; an extra column keeps the kind (number, text, bool, ...) the
        first file that has it gives it."""
        fixed = _fixed_types(table)
        seen = self._types.setdefault(table, {})
        for field in file_schema:
            want = fixed.get(field.name)
            if want is not None:
                if field.type != want and not pa.types.is_null(field.type):
                    return f"column {field.name!r} is {field.type} here, the run format says {want}"
                continue
            kind = _kind(field.type)
            if seen.get(field.name, "null") == "null":
                seen[field.name] = kind
            elif kind not in ("null", seen[field.name]):
                return f"column {field.name!r} holds {kind} here but {seen[field.name]} in earlier files"
        return None


@functools.cache
def _fixed_types(table: str) -> dict[str, pa.DataType]:
    """The run format's type of each fixed column of a table (asked once per table, not once per file)."""
    return {f.name: f.type for f in schema.arrow_schema(table)}


def _rank_range(meta: pq.FileMetaData, file_schema: pa.Schema) -> tuple[int, int] | None:
    idx = file_schema.get_field_index("rank")
    if idx < 0 or not meta.num_rows:
        return None
    lo = hi = None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(idx).statistics
        if st is None or not st.has_min_max:
            return None
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    return (int(lo), int(hi)) if lo is not None else None


def _kind(t: pa.DataType) -> str:
    """What kind of value a column holds, for the clash check: numbers mix (int widens to float)."""
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "numbers"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t):
        return "text"
    return "booleans" if pa.types.is_boolean(t) else str(t)


def claimed_twice(files: list[tuple[Path, FileFacts]]) -> dict[Path, str]:
    """Files of a table whose rows all name another rank than their folder does, while that rank's own
    folder holds files too (a rank folder copied over another's): path -> why it is left out, so the
    claimed rank's rows are read once, from its own folder."""
    folders = {layout.folder_rank(p.parent.name) for p, _ in files}
    out = {}
    for p, facts in files:
        own = layout.folder_rank(p.parent.name)
        if facts.ranks is None or facts.ranks[0] != facts.ranks[1] or facts.ranks[0] == own:
            continue
        if facts.ranks[0] in folders:
            out[p] = f"its rows are rank {facts.ranks[0]}'s, which the rank{facts.ranks[0]:03d} folder holds"
    return out
