"""Run format: round trips, direct readers, crash safety, corrupt files, versions, writer failures."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from conftest import forward_logprobs

from tokengrad import Recorder, list_runs, load_run, schema
from tokengrad.read.runs import SchemaVersionError
from tokengrad.record import Output, RunInfo


def _record(run_dir, model, n_steps=3, **kw):
    g = torch.Generator().manual_seed(0)
    with Recorder(
        run_dir,
        model=model,
        config={"lr": 1e-3},
        info=RunInfo(weighting={"name": "grpo", "params": {}}),
        **kw,
    ) as rec:
        for step in range(n_steps):
            with rec.step(step) as st:
                ids = torch.randint(0, 64, (2, 6), generator=g)
                logits, lp, _, tgt = forward_logprobs(model, ids)
                adv = torch.tensor([1.0, -1.0])
                st.track(
                    lp,
                    token_ids=tgt,
                    advantages=adv,
                    logits=logits,
                    sample_ids=torch.tensor([10, 11]),
                    group_ids=torch.tensor([5, 5]),
                    extra={"my_score": torch.full(tgt.shape, 2.0)},
                )
                st.backward(-(lp * adv[:, None]).mean())
                st.record_grad_norms()
                st.log(loss=0.5 + step, lr=1e-3, my_scalar=step * 2)
                st.samples(
                    sample_ids=[10, 11],
                    group_ids=[5, 5],
                    prompts=["p", "p"],
                    completions=["a", "b"],
                    rewards=[1.0, 0.0],
                    advantages=[1.0, -1.0],
                    lengths=[5, 5],
                    task="kk",
                    difficulty=["2", "2"],
                    n_people=[2, 2],
                )
            rec.log_eval(step, task="kk", difficulty="2", accuracy=0.25 * step, n=4)
    return run_dir


def test_round_trip_all_tables_and_extra_columns(tmp_path, tiny_model):
    run = load_run(_record(tmp_path / "r", tiny_model))
    assert run.meta["schema_version"] == schema.SCHEMA_VERSION and run.meta["finished"] is True
    assert run.meta["config"] == {"lr": 1e-3} and run.meta["weighting"]["name"] == "grpo"
    assert list(run.steps["step"]) == [0, 1, 2]
    assert list(run.steps["loss"]) == [0.5, 1.5, 2.5]
    assert list(run.steps["my_scalar"]) == [0, 2, 4]
    assert list(run.evals["accuracy"]) == [0.0, 0.25, 0.5]
    assert len(run.samples) == 6 and set(run.samples["n_people"]) == {2}
    tok = run.tokens(steps=(1, 2))
    assert len(tok) == 2 * 2 * 5 and set(tok["step"]) == {1, 2}
    assert set(tok["sample_id"]) == {10, 11} and (tok["my_score"] == 2.0).all()
    assert list(tok.columns[: len(schema.TOKENS)]) == schema.column_names("tokens")
    layers = run.layers
    assert set(layers["layer"]) >= {"total", "model.layers.0", "model.layers.1", "model.embed_tokens"}
    only = run.tokens(columns=["step", "prob"], where="prob > 0")
    assert list(only.columns) == ["step", "prob"] and len(only) == 30


def test_direct_readers_pandas_duckdb_polars(tmp_path, tiny_model):
    import polars as pl

    d = _record(tmp_path / "r", tiny_model)
    glob = str(d / "tokens" / "*" / "*.parquet")
    n_duck = duckdb.sql(f"SELECT count(*) FROM read_parquet('{glob}')").fetchall()[0][0]
    n_pd = sum(len(pd.read_parquet(f)) for f in load_run(d).files("tokens"))
    n_pl = pl.read_parquet(glob).height
    assert n_duck == n_pd == n_pl == 30
    steps = pd.read_parquet(d / "steps")
    assert sorted(steps["step"]) == [0, 1, 2]


def test_compaction_keeps_every_row_and_reader_dedupes(tmp_path, tiny_model):
    d = _record(tmp_path / "c", tiny_model, n_steps=9, output=Output(compact_every=4))
    files = load_run(d).files("tokens")
    assert len(files) < 9
    assert len(load_run(d).tokens()) == 9 * 10
    # a reader racing a compaction sees both the merged file and a small file it covers: no double count
    src = Path(files[0])
    first, last = schema.parse_file_name(src.name)
    tbl = pq.read_table(src)
    pq.write_table(tbl.slice(0, 10), src.parent / schema.file_name(first, first))
    assert len(load_run(d).tokens()) == 9 * 10


def test_corrupt_file_is_skipped_with_a_warning(tmp_path, tiny_model):
    d = _record(tmp_path / "k", tiny_model)
    bad = d / "tokens" / "rank000" / schema.file_name(900, 900)
    bad.write_bytes(b"PAR1 this is not parquet")
    run = load_run(d)
    with pytest.warns(RuntimeWarning, match="skipped corrupt file .*s00000900-00000900"):
        tok = run.tokens()
    assert len(tok) == 30


def test_newer_schema_version_is_refused(tmp_path, tiny_model):
    d = _record(tmp_path / "v", tiny_model)
    meta = json.loads((d / "meta.json").read_text())
    meta["schema_version"] = schema.SCHEMA_VERSION + 1
    (d / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaVersionError, match=f"schema version {schema.SCHEMA_VERSION + 1}"):
        load_run(d)
    with pytest.raises(FileNotFoundError, match="meta.json is missing"):
        load_run(tmp_path)


def test_writer_failure_counts_rows_and_training_goes_on(tmp_path, tiny_model, monkeypatch):
    import tokengrad.record.store.writer as w

    real = w.pq.write_table

    def failing(table, where, **kw):
        if "tokens" in str(where):
            raise OSError(28, "No space left on device")
        return real(table, where, **kw)

    monkeypatch.setattr(w.pq, "write_table", failing)
    with pytest.warns(RuntimeWarning, match="No space left"):
        d = _record(tmp_path / "f", tiny_model)
    run = load_run(d)
    assert run.meta["rows_dropped"] == {"tokens": 30}
    assert run.rows_dropped == 30
    assert len(run.steps) == 3  # the other tables were written


def test_writer_failure_can_raise(tmp_path, tiny_model, monkeypatch):
    import tokengrad.record.store.writer as w

    monkeypatch.setattr(w.pq, "write_table", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="disk full"):
            _record(tmp_path / "x", tiny_model, output=Output(on_error="raise"))


def test_two_ranks_merge(tmp_path, tiny_model, monkeypatch):
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        _record(tmp_path / "m", tiny_model, n_steps=2)
    run = load_run(tmp_path / "m")
    assert sorted(run.steps["rank"]) == [0, 0, 1, 1]
    assert run.sql("SELECT count(DISTINCT rank) AS n FROM tokens")["n"][0] == 2
    assert len(run.rank_status) == 2 and list_runs(tmp_path) == [str(tmp_path / "m")]


CHILD = textwrap.dedent("""
    import sys, time, torch
    sys.path.insert(0, {tests!r})
    from conftest import make_model, forward_logprobs
    from tokengrad import Recorder
    model = make_model()
    with Recorder({run!r}, model=model) as rec:
        for step in range(10_000):
            with rec.step(step) as st:
                ids = torch.randint(0, 64, (2, 6))
                logits, lp, _, tgt = forward_logprobs(model, ids)
                st.track(lp, token_ids=tgt, advantages=torch.ones(2), logits=logits)
                st.backward(-lp.mean())
                st.log(loss=1.0)
            print(step, flush=True)  # step ended: no flush, the writer commits in the background
""")


@pytest.mark.subprocess
def test_sigkill_mid_run_leaves_completed_steps_readable(tmp_path):
    run_dir = tmp_path / "killed"
    code = CHILD.format(tests=str(Path(__file__).resolve().parents[1]), run=str(run_dir))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    done = -1
    deadline = time.time() + 120
    while done < 30 and time.time() < deadline:
        line = proc.stdout.readline()
        if line.strip().isdigit():
            done = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run = load_run(run_dir)
    steps = sorted(run.steps["step"])
    # every ended step but the last one (which may still be in the writer's hands) is on disk, and whole
    assert steps[:done] == list(range(done))
    assert run.meta["finished"] is False
    n = run.sql("SELECT count(DISTINCT step) AS n FROM tokens")["n"][0]
    assert n >= done
    assert run.warnings == []  # no truncated file: commits are atomic


def test_resume_step_drops_rows_recorded_after_the_checkpoint(tmp_path, tiny_model):
    d = _record(
        tmp_path / "res", tiny_model, n_steps=5, output=Output(compact_every=2)
    )  # compacted and small files
    with pytest.warns(RuntimeWarning, match="resuming at step 3: removed"):
        with Recorder(d, model=tiny_model, resume_step=3) as rec:
            for step in (3, 4):
                with rec.step(step) as st:
                    st.log(loss=100.0 + step)
    run = load_run(d)
    assert run.steps["step"].tolist() == [0, 1, 2, 3, 4]
    assert run.steps["loss"].tolist() == [0.5, 1.5, 2.5, 103.0, 104.0]
    assert sorted(run.tokens()["step"].unique()) == [0, 1, 2]  # old rows of 3, 4 are gone
    assert run.evals["step"].tolist() == [0, 1, 2]


def test_queued_bundles_are_committed_together_and_read_exactly(tmp_path):
    from tokengrad.record.store.rows import scalar_table
    from tokengrad.record.store.writer import RunWriter

    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "meta.json").write_text(json.dumps({"schema_version": schema.SCHEMA_VERSION}))
    import threading

    w = RunWriter(tmp_path / "q", compact_every=1000)
    started, release = threading.Event(), threading.Event()

    def slow():  # keeps the writer busy (after it took this bundle alone) while the next ones queue up
        started.set()
        release.wait(10)
        return scalar_table("steps", [{"step": 0, "rank": 0, "loss": 0.0}])

    w.submit({"steps": slow})
    assert started.wait(10)
    for s in range(1, 6):
        w.submit({"steps": scalar_table("steps", [{"step": s, "rank": 0, "loss": float(s)}])})
    release.set()
    w.flush()
    names = sorted(p.name for p in (tmp_path / "q" / "steps" / "rank000").glob("*.parquet"))
    assert names == [schema.file_name(0, 0), schema.file_name(1, 5)]  # five queued bundles, one file
    assert load_run(tmp_path / "q").steps["loss"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    w.close()
    assert load_run(tmp_path / "q").steps["step"].tolist() == [0, 1, 2, 3, 4, 5]
