"""Runs damaged the way disks, copies and crashes damage them, for the reliability tests and the benchmark.

    from damaged_runs import DAMAGES, damaged_run      # tests/ is on sys.path under pytest
    run = damaged_run(tmp / "r", "steps_cut")           # the shipped 8-step smollm_grpo, then the damage

Every damage starts from a copy of sample_runs/smollm_grpo (8 steps 0-7, one rank, commits 1-8 in one
file per table) and changes only the files it names, with pyarrow or by cutting bytes:

* steps_cut / tokens_cut: the table's file cut to half its bytes (a copy or a disk that stopped half way);
* steps_nan_step: the steps file rewritten with `step` as float64 holding a NaN (a tool that round-tripped
  it through pandas);
* steps_many_empty / steps_many_zero_rows: N more files in steps/rank000 after the run's last commit,
  0-byte (invalid) or valid Parquet with no rows;
* rank_missing: a two-rank run (rank 1 a copy of rank 0 with rank = 1) whose rank001 folder of steps is gone;
* ranks_same_steps: a two-rank run whose rank001 folders hold rank 0's rows again (a folder copied over
  another rank's), so two folders claim rank 0's steps 0-7.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tokengrad import schema

BASE = Path(__file__).resolve().parents[1] / "sample_runs" / "smollm_grpo"
MANY = 5000  # files of the many-small-files damages at full size
FILE = "s00000001-00000008.parquet"  # every table's one file in BASE (commits 1-8)
LAST_COMMIT = 8


def _file(run: Path, table: str, rank: int = 0) -> Path:
    return run / schema.rank_dir(table, rank) / FILE


def _cut(run: Path, table: str) -> None:
    path = _file(run, table)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _nan_step(run: Path) -> None:
    path = _file(run, "steps")
    data = pq.read_table(path)
    step = pc.cast(data["step"], pa.float64()).to_pylist()
    step[3] = float("nan")
    pq.write_table(data.set_column(data.schema.get_field_index("step"), "step", pa.array(step)), path)


def _many(run: Path, n: int, zero_rows: bool) -> None:
    folder = run / schema.rank_dir("steps", 0)
    empty = schema.arrow_schema("steps").empty_table()
    for i in range(LAST_COMMIT + 1, LAST_COMMIT + 1 + n):
        path = folder / schema.file_name(i, i)
        if zero_rows:
            pq.write_table(empty, path)
        else:
            path.write_bytes(b"")


def _two_ranks(run: Path, relabel: bool = True) -> None:
    """Rank 1 as a copy of rank 0's files in every table (its `rank` column 1 when `relabel`)."""
    for table in schema.TABLES:
        src = run / schema.rank_dir(table, 0)
        if not src.is_dir():
            continue
        dst = run / schema.rank_dir(table, 1)
        dst.mkdir(parents=True)
        for path in src.glob("s*.parquet"):
            data = pq.read_table(path)
            if relabel and "rank" in data.column_names:
                rank = pa.array([1] * data.num_rows, data.schema.field("rank").type)
                data = data.set_column(data.schema.get_field_index("rank"), "rank", rank)
            pq.write_table(data, dst / path.name)
    meta_path = run / schema.META_FILE
    meta = json.loads(meta_path.read_text())
    meta["world_size"] = 2
    meta_path.write_text(json.dumps(meta, indent=2))


def _rank_missing(run: Path) -> None:
    _two_ranks(run)
    shutil.rmtree(run / schema.rank_dir("steps", 1))


DAMAGES = {  # name -> edit(run, n): n is the file count of the many-files damages
    "steps_cut": lambda run, n: _cut(run, "steps"),
    "tokens_cut": lambda run, n: _cut(run, "tokens"),
    "steps_nan_step": lambda run, n: _nan_step(run),
    "steps_many_empty": lambda run, n: _many(run, n, zero_rows=False),
    "steps_many_zero_rows": lambda run, n: _many(run, n, zero_rows=True),
    "rank_missing": lambda run, n: _rank_missing(run),
    "ranks_same_steps": lambda run, n: _two_ranks(run, relabel=False),
}


def damaged_run(dst: str | Path, damage: str, n: int = MANY) -> Path:
    """A copy of the shipped 8-step run at `dst` with `damage` (a DAMAGES name) done to it."""
    dst = Path(dst)
    shutil.copytree(BASE, dst)
    DAMAGES[damage](dst, n)
    return dst
