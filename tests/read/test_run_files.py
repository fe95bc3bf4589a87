"""tokengrad.read.layout.run_files: the one listing of a run's files that the dashboard's cache signature
(tokengrad/app/data.signature) is built from."""

from pathlib import Path

from tokengrad import schema
from tokengrad.read import layout


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


def test_run_files_lists_meta_status_and_every_data_file_as_it_lies(tmp_path):
    run = tmp_path / "run"
    meta = _touch(run / schema.META_FILE)
    status = [_touch(run / schema.RANKS_DIR / f"rank00{r}.json") for r in (1, 0)]
    _touch(run / schema.RANKS_DIR / "rank000.lock")  # a claim file: not watched
    merged = _touch(run / "steps" / "rank000" / schema.file_name(0, 9))
    redundant = _touch(run / "steps" / "rank000" / schema.file_name(3, 3))  # still on disk: listed
    _touch(layout.tmp_path(run / "steps" / "rank000" / schema.file_name(10, 10)))  # being written: never
    rank1 = _touch(run / "steps" / "rank001" / schema.file_name(0, 0))
    tokens = _touch(run / "tokens" / "rank000" / schema.file_name(0, 0))
    assert layout.run_files(run, ("steps",)) == [meta, *sorted(status), merged, redundant, rank1]
    assert layout.run_files(run, ()) == [meta, *sorted(status)]
    per_table = {"steps": [merged, redundant, rank1], "tokens": [tokens]}  # all tables: schema.TABLES order
    every = [p for t in schema.TABLES for p in per_table.get(t, [])]
    assert layout.run_files(run) == [meta, *sorted(status), *every] and len(every) == 4
    assert layout.run_files(tmp_path / "absent") == [tmp_path / "absent" / schema.META_FILE]
