"""Faults in one process: compaction left half done, files vanishing under a reader, full disks, bad input,
takeovers, clashing or damaged files, checkpoints cut between their renames, pickles that must not run.
Kill windows are driven through tokengrad.faults (TOKENGRAD_FAULT), never by timing."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tokengrad import Recorder, faults, load_run, schema
from tokengrad.read import layout
from tokengrad.record import Output, RunInfo
from tokengrad.record.store import writer
from tokengrad.record.store.rows import scalar_table

N, T = 2, 5  # two sequences of five tokens per step; the second one masks its last two
MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
TOKENS_PER_STEP = int(MASK.sum())  # 8


@pytest.fixture(autouse=True)
def _no_faults(monkeypatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.reset()


def record(run_dir, steps, **kw) -> Path:
    """Steps with 8 token rows, 1 steps row, 2 samples rows and 1 evals row each (no model needed)."""
    with Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r"), **kw) as rec:
        for step in steps:
            record_step(rec, step)
    return Path(run_dir)


def record_step(rec, step: int) -> None:
    with rec.step(step) as st:
        lp = torch.full((N, T), -1.0, requires_grad=True)
        st.track(lp, token_ids=torch.arange(N * T).view(N, T) % 7, mask=MASK, sample_ids=torch.tensor([0, 1]))
        st.backward(-lp.sum())
        st.log(loss=float(step))
        st.samples(sample_ids=[0, 1], group_ids=[0, 0], rewards=[1.0, 0.0])
    rec.log_eval(step, task="t", difficulty="1", accuracy=0.5, n=2)


def step_counts(run) -> dict[str, list[int]]:
    return {
        "steps": run.steps["step"].tolist(),
        "tokens": run.sql("SELECT step, count(*) AS n FROM tokens GROUP BY step ORDER BY step")["n"].tolist(),
    }


# ---- 3: compaction cut by a kill, then a restart ------------------------------------------------------
def test_partially_overlapping_files_are_read_once_and_repaired(tmp_path):
    """Files an older writer left after compaction + kill + compaction: s0-2 holds steps 0-2 and s1-5
    (built from leftover small files) holds steps 1-5. Both were read before; each step is read once now
    (the wider file wins), and the next writer rewrites the other one to its own range."""
    run_dir = record(tmp_path / "r", range(6), output=Output(compact_every=1000))
    folder = run_dir / "steps" / "rank000"
    make = lambda steps: scalar_table("steps", [{"step": s, "rank": 0, "loss": float(s)} for s in steps])  # noqa
    for p in folder.glob("*.parquet"):
        p.unlink()
    pq.write_table(make([0, 1, 2]), folder / schema.file_name(0, 2))
    pq.write_table(make([1, 2, 3, 4, 5]), folder / schema.file_name(1, 5))
    run = load_run(run_dir)
    assert run.steps["step"].tolist() == [0, 1, 2, 3, 4, 5]
    assert run.sql("SELECT count(*) AS n, count(DISTINCT step) AS d FROM steps").values.tolist() == [[6, 6]]
    with Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r")):  # re-open: repairs on the way in
        pass
    names = sorted(p.name for p in folder.glob("*.parquet"))
    assert names == [schema.file_name(0, 0), schema.file_name(1, 5)]
    assert load_run(run_dir).steps["step"].tolist() == [0, 1, 2, 3, 4, 5]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_small_files_left_by_a_cut_compaction_are_removed_on_reopen(tmp_path, monkeypatch):
    """The writer stops (as if killed) after removing the first small file of a merge, the others stay;
    recording then goes on in a new Recorder: it drops the leftovers instead of merging them into a file
    that overlaps the first merge, and every step is read once."""
    run_dir = tmp_path / "r"
    monkeypatch.setenv(faults.ENV, "unlinked:crash@1")
    monkeypatch.setattr(writer, "RETIRE_GRACE_S", 0.0)  # merged files removed at once: the window is now
    rec = Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r"), output=Output(compact_every=3)).open()
    for step in range(3):  # commits 0, 2, 4 (the evals take 1, 3): the third one merges
        record_step(rec, step)
    rec._writer._thread.join(10)
    assert not rec._writer._thread.is_alive()
    rec._lock.release()  # the process is gone (as after a kill): its claim with it
    monkeypatch.delenv(faults.ENV)
    found = layout.entries(run_dir / "tokens" / "rank000")
    widest = max(found, key=lambda e: e[1] - e[0])
    assert widest[0] == 0 and len(found) >= 2  # the merge and the small files it did not remove
    assert all(widest[0] <= a and b <= widest[1] for a, b, _ in found)
    record(run_dir, range(3, 9), output=Output(compact_every=3))
    run = load_run(run_dir)
    assert step_counts(run) == {"steps": list(range(9)), "tokens": [TOKENS_PER_STEP] * 9}
    evals = run.evals["step"].tolist()  # step 2's eval may have been committed with step 2 or not
    assert sorted(set(evals)) == evals and set(evals) >= {0, 1, 3, 4, 5, 6, 7, 8}


# ---- 4: files compacted away while a reader lists them ------------------------------------------------
def _merge_away(parts) -> None:
    """What a compaction does to files a reader has listed: one new merged file, the listed ones gone."""
    merged = pa.concat_tables([pq.read_table(p.path) for p in parts])
    name = schema.file_name(parts[0].first, parts[-1].last + 1)  # a new name every time
    pq.write_table(merged, parts[0].path.parent / name)
    for p in parts:
        p.path.unlink()


def _compact_after_listing(monkeypatch, times: int, where: str = "read"):
    """`times` times, the tokens files a reader listed are merged away: after the listing was checked and
    before DuckDB or pyarrow opens them (where="read"), or while they are being checked ("check")."""
    from tokengrad.read.runs import Run

    left = {"n": times}
    real = Run.parts if where == "read" else layout.table_parts

    def hooked(*args):
        parts = real(*args)
        if args[-1] == "tokens" and left["n"] > 0:
            left["n"] -= 1
            _merge_away(parts)
        return parts

    monkeypatch.setattr(*((Run, "parts") if where == "read" else (layout, "table_parts")), hooked)


@pytest.mark.parametrize("where", ["read", "check"])
def test_reads_retry_with_a_fresh_listing_when_compaction_removes_files(tmp_path, monkeypatch, where):
    run_dir = tmp_path / "r"
    for step in range(4):  # one session per step: four tokens files
        record(run_dir, [step])
    run = load_run(run_dir)
    _compact_after_listing(monkeypatch, 2, where)
    assert run.sql("SELECT count(*) AS n FROM tokens")["n"][0] == 4 * TOKENS_PER_STEP
    _compact_after_listing(monkeypatch, 1, where)
    assert len(run.tokens(columns=["step"])) == 4 * TOKENS_PER_STEP
    _compact_after_listing(monkeypatch, 1, where)
    assert len(run.table("tokens")) == 4 * TOKENS_PER_STEP
    assert run.warnings == []


def test_reads_give_up_after_a_bounded_number_of_listings(tmp_path, monkeypatch):
    from tokengrad.read.runs import READ_ATTEMPTS

    run_dir = record(tmp_path / "r", range(2))
    _compact_after_listing(monkeypatch, READ_ATTEMPTS + 5)
    with pytest.raises(OSError, match=f"kept changing over {READ_ATTEMPTS} listings"):
        load_run(run_dir).sql("SELECT count(*) FROM tokens")
    _compact_after_listing(monkeypatch, READ_ATTEMPTS + 5, "check")
    with pytest.raises(OSError, match=f"kept changing over {READ_ATTEMPTS} listings"):
        load_run(run_dir).table("tokens")


# ---- 5: a disk that stays full or read-only -------------------------------------------------------------
def test_full_disk_until_the_end_closes_cleanly_with_the_exact_count(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    record(run_dir, [])  # the run exists; from now on every Parquet write fails
    monkeypatch.setenv(faults.ENV, "write:raise")
    # 3 steps x (8 tokens + 1 steps row + 2 samples + 1 evals row) = 36 rows
    with pytest.warns(RuntimeWarning, match=r"36 rows could not be written") as got:
        record(run_dir, range(3))
    assert any("'tokens': 24" in str(w.message) for w in got)
    monkeypatch.delenv(faults.ENV)
    run = load_run(run_dir)
    assert run.rows_dropped == 36
    assert run.meta["rows_dropped"] == {"tokens": 24, "steps": 3, "samples": 6, "evals": 3}


def test_read_only_meta_and_parquet_still_end_cleanly(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    record(run_dir, [])
    monkeypatch.setenv(faults.ENV, "write:raise,meta:raise")
    with pytest.warns(RuntimeWarning, match="36 rows could not be written.*could not be saved either"):
        record(run_dir, range(3))  # no exception from close()


def test_on_error_raise_raises_at_the_failing_step_and_counts_its_rows(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    record(run_dir, [])
    monkeypatch.setenv(faults.ENV, "commit:raise@1")
    rec = Recorder(
        run_dir, config={"lr": 1.0}, info=RunInfo(name="r"), output=Output(on_error="raise")
    ).open()
    with pytest.warns(RuntimeWarning), pytest.raises(RuntimeError, match="writer failed.*No space left"):
        record_step(rec, 0)  # the step's own end raises, not the next step's
    with pytest.warns(RuntimeWarning, match="8 rows could not be written"):
        rec.close()
    assert load_run(run_dir).rows_dropped == TOKENS_PER_STEP


# ---- 6 and 7: rows lost while building are counted; counts survive re-open and resume -------------------
def test_rows_lost_while_building_are_counted_exactly_and_accumulate(tmp_path, monkeypatch):
    import tokengrad.record.step_recorder as sr

    run_dir = tmp_path / "r"

    def broken(*a, **k):
        raise ValueError("cannot build")

    monkeypatch.setattr(sr, "tokens_table", broken)
    with pytest.warns(RuntimeWarning, match=r"could not write tokens \(8 rows\)"):
        record(run_dir, [0])
    monkeypatch.undo()
    assert load_run(run_dir).rows_dropped == TOKENS_PER_STEP
    record(run_dir, [1])  # re-open: the lost rows stay lost, and counted
    assert load_run(run_dir).rows_dropped == TOKENS_PER_STEP
    assert load_run(run_dir).meta["rows_dropped"] == {"tokens": TOKENS_PER_STEP}
    with pytest.warns(RuntimeWarning, match="resuming at step 1"):
        record(run_dir, [1, 2], resume_step=1)
    assert load_run(run_dir).rows_dropped == TOKENS_PER_STEP
    assert load_run(run_dir).steps["step"].tolist() == [0, 1, 2]


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda rec: rec.begin_step(2**31), "out of range"),
        (lambda rec: rec.begin_step(1.5), "step must be an integer"),
        (lambda rec: rec.begin_step(-1), "out of range"),
        (lambda rec: _track(rec, extra={"prob": torch.zeros(N, T)}), "built-in tokens column"),
        (lambda rec: _track(rec, token_ids=torch.full((N, T), 2**31)), "outside 0..2147483647"),
        (lambda rec: _track(rec, logits=torch.zeros(N, T, 5)), r"holds 6, outside 0..4 \(the vocabulary"),
        (lambda rec: _track(rec, sample_ids=torch.tensor([3, 3])), "sample_ids repeat"),
        (lambda rec: _track(rec, sample_ids=torch.tensor([0.5, 1.5])), "sample_ids must be an integer"),
        (lambda rec: _log(rec, loss="high"), "'loss' is a numeric column"),
        (lambda rec: _log(rec, note=[1, 2]), "'note' = \\[1, 2\\] is a list"),
        (lambda rec: _log(rec, step=3), "'step' is set by the recorder"),
        (lambda rec: _log(rec, loss=torch.ones(2)), "must be a scalar"),
    ],
)
def test_bad_values_are_refused_at_the_call(tmp_path, call, words):
    with Recorder(tmp_path / "r") as rec:
        with pytest.raises(ValueError, match=words):
            call(rec)


def _track(rec, **kw):
    st = rec.begin_step(0)
    lp = torch.zeros(N, T, requires_grad=True)
    args = dict(token_ids=torch.arange(N * T).view(N, T) % 7, sample_ids=torch.tensor([0, 1]))
    st.track(lp, **{**args, **kw})


def _log(rec, **kw):
    rec.begin_step(0).log(**kw)


def test_steps_must_increase_also_across_reopen(tmp_path):
    run_dir = record(tmp_path / "r", [0, 1])
    with Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r")) as rec:
        with pytest.raises(ValueError, match="step 1 does not come after step 1.*resume_step=1"):
            rec.begin_step(1)
        record_step(rec, 2)
        with pytest.raises(ValueError, match="step 2 does not come after step 2"):
            rec.begin_step(2)


def test_undecodable_token_ids_keep_their_rows(tmp_path):
    class Tok:
        def decode(self, ids):
            if ids[0] == 3:
                raise KeyError(3)
            return f"<{ids[0]}>"

    with pytest.warns(RuntimeWarning, match="cannot decode token id 3"):
        record(tmp_path / "r", [0], tokenizer=Tok())
    tokens = load_run(tmp_path / "r").tokens(columns=["token_id", "token"])
    assert len(tokens) == TOKENS_PER_STEP
    assert tokens[tokens.token_id == 3]["token"].isna().all()
    assert (tokens[tokens.token_id == 2]["token"] == "<2>").all()


# ---- 8: a Recorder does not take over another run's directory -------------------------------------------
def test_recorder_refuses_another_run_and_a_newer_schema(tmp_path):
    run_dir = record(tmp_path / "r", [0])
    before = (run_dir / "meta.json").read_text()
    with pytest.raises(ValueError, match="already holds another run \\(run_name, config differ"):
        Recorder(run_dir, config={"lr": 2.0}, info=RunInfo(name="other")).open()
    assert (run_dir / "meta.json").read_text() == before
    meta = json.loads(before)
    (run_dir / "meta.json").write_text(json.dumps({**meta, "schema_version": schema.SCHEMA_VERSION + 1}))
    with pytest.raises(ValueError, match="will not downgrade"):
        Recorder(run_dir, config={"lr": 1.0}, info=RunInfo(name="r"), resume_step=1).open()
    assert json.loads((run_dir / "meta.json").read_text())["schema_version"] == schema.SCHEMA_VERSION + 1
    (run_dir / "meta.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        Recorder(run_dir).open()


def test_resuming_may_change_the_config(tmp_path):
    run_dir = record(tmp_path / "r", [0, 1])
    created = json.loads((run_dir / "meta.json").read_text())["created"]
    with pytest.warns(RuntimeWarning, match="resuming at step 1"):
        record(run_dir, [1], resume_step=1, output=Output(compact_every=7))
    with Recorder(run_dir, config={"lr": 1.0, "steps": 9}, info=RunInfo(name="r"), resume_step=2):
        pass
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["config"] == {"lr": 1.0, "steps": 9} and meta["created"] == created


def test_a_run_that_ends_in_an_error_is_not_finished(tmp_path):
    with pytest.raises(KeyError):
        with Recorder(tmp_path / "r") as rec:
            record_step(rec, 0)
            raise KeyError("boom")
    run = load_run(tmp_path / "r")
    assert run.meta["finished"] is False and run.steps["step"].tolist() == [0]
    assert run.rank_status[0]["finished"] is False


# ---- 9: clashing column types and damaged pages -----------------------------------------------------
def test_a_file_with_clashing_types_is_skipped_with_its_name(tmp_path):
    run_dir = record(tmp_path / "r", [0, 1])
    folder = run_dir / "steps" / "rank000"
    bad = folder / schema.file_name(50, 50)
    pq.write_table(
        pa.table(
            {"step": pa.array([7], pa.int32()), "rank": pa.array([0], pa.int16()), "loss": pa.array(["high"])}
        ),
        bad,
    )
    odd = folder / schema.file_name(60, 60)
    good = pq.read_table(sorted(folder.glob("s*.parquet"))[0]).slice(0, 1)  # step 0
    pq.write_table(good.append_column("mood", pa.array(["calm"])), folder / schema.file_name(55, 55))
    pq.write_table(good.append_column("mood", pa.array([1.5])), odd)
    run = load_run(run_dir)
    with pytest.warns(RuntimeWarning, match="skipped file"):
        steps = run.steps
    assert steps["step"].tolist() == [0, 0, 1]  # the first mood file is read, the clashing ones are not
    assert any(str(bad) in w and "'loss' is string here" in w for w in run.warnings)
    assert any(str(odd) in w and "'mood' holds numbers here but text" in w for w in run.warnings)
    assert run.sql("SELECT count(*) AS n FROM steps")["n"][0] == 3


def test_a_corrupt_page_behind_a_valid_footer_is_skipped(tmp_path):
    run_dir = tmp_path / "r"
    for step in range(3):  # one session per step: three tokens files
        record(run_dir, [step])
    victim = sorted((run_dir / "tokens" / "rank000").glob("s*.parquet"))[1]
    data = bytearray(victim.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little") + 8
    for i in range(8, len(data) - footer, 7):  # every 7th byte of the column chunks, the footer intact
        data[i] ^= 0x5A
    victim.write_bytes(bytes(data))
    pq.read_metadata(victim)  # the footer still reads
    run = load_run(run_dir)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert sorted(run.tokens(columns=["step"])["step"].unique()) == [0, 2]
        assert run.sql("SELECT count(*) AS n FROM tokens")["n"][0] == 2 * TOKENS_PER_STEP
        assert len(run.table("tokens")) == 2 * TOKENS_PER_STEP
    assert any(str(victim) in w and "corrupt" in w for w in run.warnings)


# ---- 11 and 2: checkpoints ------------------------------------------------------------------------------
class _Tok:
    def save_pretrained(self, path):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "tokenizer.json").write_text("{}")


def _save(run_dir, step, model, opt):
    from tokengrad.train.checkpoint import save_checkpoint

    return save_checkpoint(
        run_dir, step, model=model, tokenizer=_Tok(), optimizer=opt, config={"lr": 0.1}, data_step=step
    )


def _model_and_opt(tiny_model):
    opt = torch.optim.AdamW(tiny_model.parameters(), lr=0.1)
    tiny_model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    return tiny_model, opt


def test_kill_between_the_two_renames_recovers_the_newer_checkpoint(tmp_path, tiny_model, monkeypatch):
    from tokengrad.train.checkpoint import checkpoint_path, has_checkpoint, load_trainer_state

    model, opt = _model_and_opt(tiny_model)
    _save(tmp_path, 3, model, opt)
    monkeypatch.setenv(faults.ENV, "checkpoint_renamed:crash")
    with pytest.raises(faults.SimulatedCrash):
        _save(tmp_path, 5, model, opt)
    monkeypatch.delenv(faults.ENV)
    assert not checkpoint_path(tmp_path).exists() and has_checkpoint(tmp_path)
    with pytest.warns(RuntimeWarning, match="recovered the checkpoint.*from .checkpoint.tmp"):
        state = load_trainer_state(tmp_path)
    assert state["step"] == 5 and state["data_step"] == 5
    assert state["optimizer"]["state"][0]["exp_avg"].shape == next(model.parameters()).shape
    assert (checkpoint_path(tmp_path) / "model" / "model.safetensors").exists()


def test_an_interrupted_first_write_keeps_the_old_checkpoint(tmp_path, tiny_model, monkeypatch):
    from tokengrad.train.checkpoint import load_trainer_state

    model, opt = _model_and_opt(tiny_model)
    _save(tmp_path, 3, model, opt)
    monkeypatch.setenv(faults.ENV, "checkpoint_write:raise")
    with pytest.raises(OSError):
        _save(tmp_path, 5, model, opt)
    monkeypatch.delenv(faults.ENV)
    assert load_trainer_state(tmp_path)["step"] == 3
    assert not (tmp_path / ".checkpoint.tmp").exists()


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):  # unpickling calls open(marker, "w"): it must never happen
        return (open, (self.marker, "w"))


def test_a_crafted_pickle_in_trainer_pt_is_not_run(tmp_path, tiny_model):
    from tokengrad.train.checkpoint import checkpoint_path, load_trainer_state

    model, opt = _model_and_opt(tiny_model)
    _save(tmp_path, 1, model, opt)
    marker = tmp_path / "code_ran"
    trainer_pt = checkpoint_path(tmp_path) / "trainer.pt"
    torch.save({"step": 1, "optimizer": {}, "config": {}, "x": _Payload(str(marker))}, trainer_pt)
    with pytest.raises(ValueError, match="other than tensors and plain data"):
        load_trainer_state(tmp_path)
    assert not marker.exists()
    with open(trainer_pt, "wb") as f:  # a plain pickle too (not torch's zip format)
        pickle.dump({"step": 1, "x": _Payload(str(marker))}, f)
    with pytest.raises(ValueError, match="other than tensors and plain data"):
        load_trainer_state(tmp_path)
    assert not marker.exists()
    torch.save({"step": 1, "optimizer": {}, "config": {}}, trainer_pt)
    (checkpoint_path(tmp_path) / "model" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="holds pickled weights"):
        load_trainer_state(tmp_path)


# ---- Low: a run killed before its first checkpoint -----------------------------------------------------
def test_a_run_without_a_checkpoint_offers_resume_from_step_0(tmp_path):
    from letters_task import LettersTask  # noqa: F401  (registers the "letters" task)

    from tokengrad.train.trainer import train

    cfg = dict(
        model="tiny",
        task="letters",
        steps=2,
        prompts_per_step=2,
        group_size=2,
        max_new_tokens=4,
        bf16=False,
        progress=False,
        run_dir=str(tmp_path / "run"),
    )
    train({**cfg, "checkpoint": False})  # leaves a run without a checkpoint, as a kill before the first one
    with pytest.raises(ValueError, match="pass resume=true to continue it \\(from step 0, as it has no "):
        train(cfg)
    with pytest.warns(RuntimeWarning, match="has no checkpoint .* starting it again from step 0"):
        run_dir = train({**cfg, "resume": True})
    run = load_run(run_dir)
    assert run.steps["step"].tolist() == [0, 1] and run.meta["finished"] is True
    with pytest.raises(ValueError, match="config keys \\['lr'\\] differ"):
        train({**cfg, "resume": True, "lr": 0.5, "steps": 4})
