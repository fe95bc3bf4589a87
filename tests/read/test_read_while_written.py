"""The reader guarantee while a run is written and compacted: a reader never gives up and reads every step
once, even with a listing made before a compaction (docs/run_format.md, "What a reader sees")."""

from __future__ import annotations

import threading
import warnings

import pytest
from test_reliability import TOKENS_PER_STEP, record_step

from tokengrad import Recorder, faults, load_run
from tokengrad.read import runs
from tokengrad.record import Output, RunInfo


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()


def test_a_listing_made_before_a_compaction_stays_readable(tmp_path, monkeypatch):
    """Files listed before a merge are still there after it: the read needs no second listing."""
    run_dir = tmp_path / "r"
    rec = Recorder(run_dir, config={}, info=RunInfo(name="r"), output=Output(compact_every=3)).open()
    for step in range(2):  # two tokens files: no merge yet
        record_step(rec, step)
    rec.flush()
    run = load_run(run_dir)
    old = {t: run.parts(t) for t in ("steps", "tokens")}
    record_step(rec, 2)  # the third tokens file: merged with the first two
    rec.flush()
    monkeypatch.setattr(runs, "READ_ATTEMPTS", 1)  # one listing only: no retry may hide a vanished file
    monkeypatch.setattr(runs.Run, "parts", lambda self, table: old.get(table, []))
    stale = load_run(run_dir)
    assert stale.steps["step"].tolist() == [0, 1]
    assert stale.sql("SELECT count(*) AS n FROM tokens")["n"][0] == 2 * TOKENS_PER_STEP
    rec.close()


def test_tight_reads_while_compacting_every_three_steps_never_fail(tmp_path):
    """A shorter form of benchmarks/bench_read_while_compacting.py: a writer thread at full speed merging
    every 3 commits, a reader in a tight loop; every read succeeds and holds steps 0..k exactly once."""
    run_dir = tmp_path / "r"
    rec = Recorder(run_dir, config={}, info=RunInfo(name="r"), output=Output(compact_every=3)).open()
    record_step(rec, 0)
    rec.flush()
    writer = threading.Thread(target=lambda: [record_step(rec, step) for step in range(1, 91)])
    writer.start()
    bad, reads = [], 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a skipped or vanished file would warn
            while writer.is_alive():
                run = load_run(run_dir)
                steps = run.steps["step"].tolist()
                n = run.sql("SELECT step, count(*) AS n FROM tokens GROUP BY step ORDER BY step")
                reads += 1
                if steps != list(range(len(steps))) or (n["n"] != TOKENS_PER_STEP).any():
                    bad.append((steps, n["n"].tolist()))
    finally:
        writer.join()
        rec.close()
    assert reads >= 10 and bad == []
    assert load_run(run_dir).steps["step"].tolist() == list(range(91))
