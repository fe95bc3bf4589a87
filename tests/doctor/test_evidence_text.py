"""A finding's token evidence names a character split over several tokens whole, marked as a part of it
(tokengrad.read.evidence_text, tokengrad.doctor.culprits), while the evidence keeps the recorded id."""

import json

import pytest
from test_queries import _token_rows, _write
from test_token_text import _byte_fallback, _byte_level_bpe

from tokengrad import load_run, schema
from tokengrad.doctor.culprits import culprits
from tokengrad.doctor.finding import Finding, TokenEvidence
from tokengrad.doctor.report import as_html, as_text
from tokengrad.doctor.view import RunView
from tokengrad.read.token_text import evidence_text, split_parts
from tokengrad.record.token_text import piece_text

TEXT = "a語😀b"  # 語 = E8 AA 9E, 😀 = F0 9F 98 80: both split into byte tokens by either tokenizer


@pytest.fixture(scope="module", params=["byte_level_bpe", "byte_fallback"])
def stored(request):
    """The token texts the recorder writes for TEXT, and their ids."""
    tok = {"byte_level_bpe": _byte_level_bpe, "byte_fallback": _byte_fallback}[request.param]()
    ids = tok.encode(TEXT, add_special_tokens=False)
    return [piece_text(tok, i) for i in ids], ids


def _expected(texts):
    """By hand: where each byte token of 語 and 😀 sits, from the byte count of each character."""
    at = {t: i for i, t in enumerate(texts)}
    return at["<0xE8>"], at["<0xF0>"]


def test_each_part_names_the_whole_character(stored):
    texts, _ = stored
    go, smile = _expected(texts)
    assert texts[go : go + 3] == ["<0xE8>", "<0xAA>", "<0x9E>"]
    assert texts[smile : smile + 4] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    for k in range(3):
        assert evidence_text(texts, go + k) == f"語 (token {k + 1} of 3 of a split character)"
        assert split_parts(texts)[go + k] == [("語", k + 1, 3)]
    for k in range(4):
        assert evidence_text(texts, smile + k) == f"😀 (token {k + 1} of 4 of a split character)"
    assert evidence_text(texts, 0).strip("▁ ") == "a"  # a whole token reads as itself


def test_a_token_completing_one_character_and_holding_more_says_so():
    texts = ["<0xE4>", "<0xB8>", "<0xAD>文", "<0xE8>", "<0xAA><0x9E>"]
    assert evidence_text(texts, 2) == "中文 (token 3 of 3 of 中, a split character)"
    assert evidence_text(texts, 4) == "語 (token 2 of 2 of a split character)"
    both = ["<0xE4>", "<0xB8><0xAD><0xE8>", "<0xAA><0x9E>"]
    assert evidence_text(both, 1) == "中語 (token 2 of 2 of 中, token 1 of 2 of 語: split characters)"
    assert evidence_text(["<0xE4>", "x"], 0) == "<0xE4>"  # never completed: its byte as stored


@pytest.fixture(scope="module")
def run(tmp_path_factory, stored):
    texts, ids = stored
    vocab = tuple(dict.fromkeys(texts))
    # one sample; the higher the position the lower p, so logit_grad_norm ranks the last tokens first
    spec = [(0, pos, t, 0.9 - 0.1 * pos, 1.0, 0.5, True) for pos, t in enumerate(texts)]
    rows = _token_rows(0, 0, spec, vocab=vocab)
    for r, i in zip(rows, ids):
        r["token_id"] = int(i)
    run_dir = tmp_path_factory.mktemp("split")
    meta = {"schema_version": schema.SCHEMA_VERSION, "run_name": "s"}
    (run_dir / schema.META_FILE).write_text(json.dumps(meta))
    _write(run_dir, "tokens", rows)
    return load_run(run_dir)


def test_culprits_name_the_character_and_keep_the_id(run, stored):
    texts, ids = stored
    go, smile = _expected(texts)
    found = {t.position: t for t in culprits(RunView(run), 0, k=len(texts))}
    for k in range(4):
        t = found[smile + k]
        assert t.text == f"😀 (token {k + 1} of 4 of a split character)" and t.token_id == ids[smile + k]
    assert found[go + 1].text == "語 (token 2 of 3 of a split character)"
    finding = Finding(
        id="x", severity="info", confidence=0.5, first_step=0, last_step=0, message="m",
        tokens=(found[smile], TokenEvidence(step=0, sample_id=0, position=9, text="Ġä¸Ńæĸĩ")),
    )  # fmt: skip
    text = as_text([finding], tokens=2)
    assert "'😀 (token 1 of 4 of a split character)'" in text and "<0x" not in text
    assert "' 中文'" in text  # a raw byte-level piece from another tool reads as its characters
    assert "😀 (token 1 of 4 of a split character)" in as_html([finding], ["s"])
