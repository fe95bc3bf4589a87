"""`tokengrad inspect` on a run with many unusable files: the skipped files as one count (by table) and the
first few (tokengrad.read.skipped), not a line per file on stdout and two more on stderr."""

from __future__ import annotations

from test_reliability import record

from tokengrad.cli import main
from tokengrad.read.skipped import skipped_lines


def test_inspect_summarises_hundreds_of_empty_files_in_a_few_lines(tmp_path, capsys):
    run_dir = record(tmp_path / "r", range(2))
    for i in range(150):
        (run_dir / "tokens" / "rank000" / f"s{100 + i:08d}-{100 + i:08d}.parquet").write_bytes(b"")
    for i in range(50):
        (run_dir / "samples" / "rank000" / f"s{100 + i:08d}-{100 + i:08d}.parquet").write_bytes(b"")
    assert main(["inspect", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    lost = [line for line in out.splitlines() if line.startswith("lost")]
    # one line per table that lost files, whatever their number, and no line per file
    assert len(lost) == 2 and all("unreadable" in line for line in lost), lost
    assert any("tokens table" in line for line in lost) and any("samples table" in line for line in lost)
    assert len(out.splitlines()) < 30
    assert "tokens     16 rows in 1 files" in out  # the good rows are all still read: 2 steps x 8 tokens
    assert err == ""  # the reader's own warnings are in the summary, not repeated per file


def test_each_file_counts_once_and_other_warnings_stay_as_they_are():
    warnings = [
        "could not read meta.json's created date",
        "skipped corrupt file /r/tokens/rank001/s1-1.parquet: ArrowInvalid: bad footer",
        "skipped file /r/tokens/rank001/s1-1.parquet: it has no columns",  # the same file again
        "skipped unreadable status file /r/ranks/rank000.json: Expecting value",
        "could not read meta.json's created date",
    ]
    assert skipped_lines(warnings) == [
        "could not read meta.json's created date",
        "skipped 2 files the reader could not use (other 1, tokens 1):",
        "  skipped corrupt file /r/tokens/rank001/s1-1.parquet: ArrowInvalid: bad footer",
        "  skipped unreadable status file /r/ranks/rank000.json: Expecting value",
    ]
    assert skipped_lines(warnings[:1]) == warnings[:1] and skipped_lines([]) == []
