"""Where an importer's rows go: one RunWriter per source rank (record/store/writer.py), tables conformed to
the run format (tokengrad.schema), and a meta.json that says where the run came from and which columns and
tables the source did not record.

    with RunSink(out_dir, Provenance("prime_rl", src, ...), world_size=2) as sink:
        sink.write(step=3, rank=0, tokens={"sample_id": [...], "logprob": [...]}, steps={...})
        meta = sink.close()   # commits, status files, meta.json with meta["imported"]["not_recorded"]

Rows go to a staging folder next to `out_dir` (tokengrad.importers.staging) that close() moves into place
once meta.json is written; an import that fails or is killed never leaves part of a run at `out_dir`, and
leaving the `with` block on an error removes the staging folder.

A column the source has no value for is written as null, never as 0: the read side then shows "not
recorded" (tokengrad.read.provenance) and the doctor lists the detectors that need it as not checked.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa

from tokengrad import schema
from tokengrad._version import __version__
from tokengrad.importers.staging import Staging
from tokengrad.record.store.run_meta import write_meta, write_status
from tokengrad.record.store.writer import RunWriter

# The tables an importer fills; the others (layers, buckets, evals, prob_bins, vocab) need the gradient or
# an evaluation loop, which no dump holds.
IMPORTED_TABLES = ("tokens", "samples", "steps")
_KEYS = {"step", "rank"}


@dataclass
class Provenance:
    """What meta.json["imported"] says about the source (besides the columns left null)."""

    format: str
    source: str
    source_layout: str  # the file layout read, in words, with the source's own version where it has one
    derived: dict[str, str] = field(default_factory=dict)  # column -> how it was computed from the source
    notes: list[str] = field(default_factory=list)


class RunSink:
    """Writes an imported run directory `out` (absent or empty: anything in it is refused).

    Args:
        out: the new run directory.
        provenance: the source, for meta.json.
        world_size: ranks of the source (1 when it does not say).
        config: meta.json's `config` (the settings the source states; read by tokengrad.doctor.settings).
        model, tokenizer, temperature: meta.json labels where the source names them.
    """

    def __init__(
        self,
        out: str | os.PathLike,
        provenance: Provenance,
        *,
        world_size: int = 1,
        config: dict | None = None,
        model: str | None = None,
        tokenizer: str | None = None,
        temperature: float | None = None,
    ):
        self.out = Path(out)
        self.provenance = provenance
        self.meta = {
            "schema_version": schema.SCHEMA_VERSION,
            "tokengrad_version": __version__,
            "run_name": self.out.name,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "config": config or {},
            "weighting": {"name": "none", "params": {}},
            "model": model,
            "tokenizer": tokenizer,
            "world_size": world_size,
            "bucket_every": 0,
            "bucket_edges": list(schema.DEFAULT_BUCKET_EDGES),
            "attribute_every": 0,
            "token_budget": None,
            "rows_dropped": {},
            "finished": False,
            "temperature": temperature,
        }
        self._writers: dict[int, RunWriter] = {}
        self._last_step: dict[int, int] = {}
        self._seen: dict[str, set[str]] = {t: set() for t in IMPORTED_TABLES}  # columns with a value
        self._rows: dict[str, int] = dict.fromkeys(IMPORTED_TABLES, 0)
        self._stage = Staging(self.out)  # last: the checks above raise before anything is created
        self.dir = self._stage.path  # where the rows go until close() moves them to `out`

    def __enter__(self) -> "RunSink":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()

    def discard(self) -> None:
        """An import that failed: its writers stopped, its staging folder removed (`out` untouched)."""
        for writer in self._writers.values():
            try:
                writer.close()
            except Exception:  # noqa: BLE001 -- the rows are thrown away with the folder
                pass
        self._writers.clear()
        self._stage.discard()

    def write(self, step: int, rank: int = 0, **tables: dict[str, list]) -> None:
        """Commit one step of one rank: table name -> columns (name -> values, one per row)."""
        bundle = {}
        for table, columns in tables.items():
            if columns is None:
                continue
            data = conform(table, columns, step, rank)
            if data.num_rows:
                self._note(table, data)
                bundle[table] = data
        if bundle:
            self._writer(rank).submit(bundle)
            self._last_step[rank] = max(step, self._last_step.get(rank, step))

    def close(self) -> dict:
        """Finish the run: every writer closed, status files and meta.json written, the run moved to `out`;
        returns meta.json. Nothing reaches `out` when a file of the run could not be written."""
        if not self._writers:
            self.discard()
            raise ValueError(f"the source held no rows to import; nothing was written to {self.out}")
        dropped: dict[str, int] = {}
        saved = True
        for rank, writer in sorted(self._writers.items()):
            writer.close()
            saved = write_status(self.dir, rank, True, self._last_step.get(rank), writer) and saved
            for table, n in writer.rows_dropped.items():
                dropped[table] = dropped.get(table, 0) + n
        self.meta["imported"] = self._imported()
        if not (write_meta(self.dir, self.meta, True, dropped) and saved):
            self.discard()
            raise OSError(f"the run's metadata could not be written next to {self.out}; nothing was imported")
        self._stage.commit()
        return json.loads((self.out / schema.META_FILE).read_text())

    def _writer(self, rank: int) -> RunWriter:
        if rank not in self._writers:
            self._writers[rank] = RunWriter(self.dir, rank=rank, on_error="raise")
        return self._writers[rank]

    def _note(self, table: str, data: pa.Table) -> None:
        self._rows[table] += data.num_rows
        for name in data.column_names:
            if data[name].null_count < data.num_rows:
                self._seen[table].add(name)

    def _imported(self) -> dict:
        p = self.provenance
        if "masked" in self._seen["tokens"]:  # masked_by null then means "kept", a recorded value
            self._seen["tokens"].add("masked_by")
        return {
            "format": p.format,
            "source": p.source,
            "source_layout": p.source_layout,
            "rows": self._rows,
            "tables_not_recorded": [t for t in schema.TABLES if not self._rows.get(t)],
            "not_recorded": {
                t: [c for c in schema.column_names(t) if c not in self._seen[t] and c not in _KEYS]
                for t in IMPORTED_TABLES
                if self._rows[t]
            },
            "derived": dict(p.derived),
            "notes": list(p.notes),
        }


def conform(table: str, columns: dict[str, list], step: int, rank: int) -> pa.Table:
    """A table of the run format from columns of plain values: the schema's columns with its types (absent
    ones null), the step and rank filled in, extra columns (float, int or text) after them."""
    fixed = schema.arrow_schema(table)
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise ValueError(f"{table} columns of step {step} have different lengths: {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    given = {**columns, "step": [step] * n, "rank": [rank] * n}
    arrays, fields = [], []
    for f in fixed:
        values = given.get(f.name)
        if values is None and not f.nullable:
            raise ValueError(f"{table}.{f.name} has no value in step {step}; the run format needs one")
        arrays.append(pa.array(_clean(values) if values is not None else [None] * n, type=f.type))
        fields.append(f)
    # an extra column the source left empty in this step is not written (a later step may have it)
    extra = [k for k in columns if k not in fixed.names and any(v is not None for v in columns[k])]
    if extra and table not in schema.EXTENSIBLE:
        raise ValueError(f"{table} takes no extra columns, got {extra}")
    for name in extra:
        arr = pa.array(_clean(columns[name]))
        if pa.types.is_boolean(arr.type):
            arr = arr.cast(pa.int8())
        if not (
            pa.types.is_floating(arr.type) or pa.types.is_integer(arr.type) or pa.types.is_string(arr.type)
        ):
            raise ValueError(
                f"extra {table} column {name!r} holds {arr.type}; the run format takes numbers or text"
            )
        arrays.append(arr)
        fields.append(pa.field(name, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _clean(values: list) -> list:
    """NaN and inf become null: the source wrote no usable value (the recorder stores a NaN reward as null
    too, and JSON sources write null for them)."""
    return [None if isinstance(v, float) and not math.isfinite(v) else v for v in values]
