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
    warned = [line for line in out.splitlines() if line.startswith("warning")]
    assert (
        warned[0]
        == "warning    skipped 200 files the reader could not use (samples 50, tokens 150); the first 3:"
    )
    assert (
        len(warned) == 5
        and warned[-1] == "warning      ... and 197 more (load_run(RUN).warnings lists every one)"
    )
    assert (
        warned[1].startswith("warning      skipped corrupt file ")
        and "Parquet file size is 0 bytes" in warned[1]
    )
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
