"""Input that used to break a run or a reader: text that is not valid UTF-8, damaged meta.json, files with
no columns, looping symlinks and table folders linking out of the served root."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch

from tokengrad import Recorder, load_run
from tokengrad.cli import main
from tokengrad.record import RunInfo

BAD = b"\xff".decode("utf-8", "surrogateescape")  # what os.fsdecode / surrogateescape readers give: \udcff


class SurrogateTokenizer:
    name_or_path = "fake"

    def decode(self, ids):
        return "x" + BAD if ids[0] == 6 else f"t{ids[0]}"


def test_text_that_is_not_utf8_is_stored_escaped_and_no_row_is_dropped(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Recorder(tmp_path / "r", tokenizer=SurrogateTokenizer(), info=RunInfo(name="r")) as rec:
            for step in range(2):
                ids = torch.tensor([[6, 1, 2], [1, 2, 3]])  # [N, T]: one token's text is not UTF-8
                lp = torch.full((2, 3), -1.0, requires_grad=True)
                with rec.step(step) as st:
                    st.track(lp, token_ids=ids)
                    st.backward(-lp.sum())
                    st.log(loss=1.0, note="n" + BAD)
                    st.samples(sample_ids=[0, 1], group_ids=[0, 0], completions=["fine", "c" + BAD])
    run = load_run(tmp_path / "r")
    assert run.rows_dropped == 0
    assert run.sql("SELECT count(*) AS n FROM tokens")["n"][0] == 12
    assert sorted(set(run.tokens(columns=["token"])["token"])) == ["t1", "t2", "t3", "x\\udcff"]
    assert run.steps["note"].tolist() == ["n\\udcff"] * 2
    assert run.samples["completion"].tolist() == ["fine", "c\\udcff"] * 2
    said = [str(w.message) for w in caught]
    assert any("st.log(): 'note' holds text that is not valid UTF-8" in m for m in said)
    assert not any("writer" in m for m in said)  # nothing failed on the writer thread


@pytest.fixture
def small_run(tmp_path):
    with Recorder(tmp_path / "r", config={"lr": 1.0}, info=RunInfo(name="r")) as rec:
        with rec.step(0) as st:
            st.log(loss=1.0)
    return tmp_path / "r"


def _edit_meta(run_dir, **changes) -> None:
    meta = json.loads((run_dir / "meta.json").read_text())
    (run_dir / "meta.json").write_text(json.dumps({**meta, **changes}))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(schema_version="3"), "'schema_version' must be an integer, got \"3\""),
        (dict(schema_version=True), "'schema_version' must be an integer, got true"),
        (dict(weighting="tr_grpo"), "'weighting' must be an object, got \"tr_grpo\""),
        (dict(finished="yes"), "'finished' must be true or false"),
    ],
)
def test_meta_values_of_the_wrong_type_are_named_with_the_file(small_run, change, message):
    _edit_meta(small_run, **change)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        load_run(small_run)
    assert str(small_run / "meta.json") in str(err.value)
    assert main(["inspect", str(small_run)]) == 2  # one error line, no traceback


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
        (b'{"run_name": "lab\xffgrpo"}', "is not valid UTF-8"),
        (b"{", "is not valid JSON"),
        (b'{"run_name": "r"}', "has no schema_version"),
    ],
)
def test_damaged_meta_files_are_named(small_run, content, message, capsys):
    (small_run / "meta.json").write_bytes(content)
    with pytest.raises(ValueError, match=message) as err:
        load_run(small_run)
    assert str(small_run / "meta.json") in str(err.value)
    assert main(["inspect", str(small_run)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_parquet_file_with_no_columns_is_skipped_with_a_warning(small_run):
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = small_run / "steps" / "rank000" / "s00009999-00009999.parquet"
    pq.write_table(pa.table({}), empty)
    with pytest.warns(RuntimeWarning, match="it has no columns"):
        run = load_run(small_run)
        assert run.steps["step"].tolist() == [0]
        assert run.sql("SELECT count(*) AS n FROM steps")["n"][0] == 1
    assert any(str(empty) in w for w in run.warnings)


def test_looping_symlink_files_are_skipped_and_every_read_works(small_run, capsys):
    folder = small_run / "steps" / "rank000"
    (folder / "s00009998-00009998.parquet").symlink_to("s00009999-00009999.parquet")
    (folder / "s00009999-00009999.parquet").symlink_to("s00009998-00009998.parquet")
    with pytest.warns(RuntimeWarning, match="s00009999-00009999.parquet"):
        run = load_run(small_run)
        assert run.steps["step"].tolist() == [0]
        assert run.sql("SELECT count(*) AS n FROM steps")["n"][0] == 1
    assert main(["inspect", str(small_run)]) == 0


def test_a_looping_folder_typed_in_the_runs_box_is_a_clear_error(tmp_path):
    from tokengrad.read.served_root import confine

    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with pytest.raises(ValueError, match="cannot be opened"):
        confine(tmp_path / "loop" / "x", tmp_path)


def test_a_table_folder_linking_out_of_the_run_is_not_followed(tmp_path, small_run):
    outside = tmp_path / "private"
    with Recorder(outside, config={"secret": 1}, info=RunInfo(name="p")) as rec:
        with rec.step(0) as st:
            st.samples(sample_ids=[0], group_ids=[0], completions=["private text"])
    (small_run / "samples").symlink_to(outside / "samples")
    with pytest.warns(RuntimeWarning, match="links outside the run folder"):
        assert load_run(small_run).samples.empty
    assert load_run(small_run, follow_links_out=True).samples["completion"].tolist() == ["private text"]
