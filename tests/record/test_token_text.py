"""Token text: bytes a lone vocabulary piece cannot decode are stored as <0xNN>, never as U+FFFD; for
display, characters split over tokens are merged back (tokengrad.read.token_text) and read as decoded."""

import pytest

from tokengrad.read.token_text import (
    CONTINUATION,
    byte_level_table,
    is_byte_level,
    merge_tokens,
    readable_text,
    readable_token,
)
from tokengrad.record import token_text as record_token_text
from tokengrad.record.token_text import bytes_text, piece_text


class ByteLevel:
    """A byte-level BPE tokenizer's two views of a piece: decode() and the raw vocabulary string."""

    raw = {0: "âĢ", 1: "âĢĶ", 2: "Ġthe", 3: "<0xe2>"}

    def decode(self, ids):
        data = {0: b"\xe2\x80", 1: b"\xe2\x80\x94", 2: b" the", 3: b"\xe2"}[ids[0]]
        return data.decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, i):
        return self.raw[i]


def test_undecodable_bytes_read_as_hex():
    tok = ByteLevel()
    # GPT-2 table: 'â' is byte 0xE2 itself, 'Ģ' = U+0122 stands for 0x80 (the 34th unprintable byte),
    # 'Ķ' = U+0136 for 0x94; E2 80 94 is '—' (U+2014)
    assert piece_text(tok, 0) == "<0xE2><0x80>"
    assert piece_text(tok, 1) == "\u2014"
    assert piece_text(tok, 2) == " the"  # decodes: left alone
    assert piece_text(tok, 3) == "<0xE2>"  # SentencePiece byte fallback
    assert bytes_text(b"a\xffb") == "a<0xFF>b"


# ---------------------------------------------------------------- display: characters merged across tokens

TEXTS = ("the cat 中文 語 😀 👩‍💻 café", "中文 and 😀😀, naïve—done", "語")


def _byte_level_bpe():
    """A byte-level BPE (GPT-2 style) trained offline on a few strings: '中文' is one piece, '語' and every
    emoji are split into byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet, show_progress=False)
    core.train_from_iterator(["the cat sat on the mat", "中文 中文 中文 中文"] * 5, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core)


def _byte_fallback():
    """A SentencePiece-style BPE with byte fallback: characters outside its vocabulary become <0xNN>."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    for i, ch in enumerate("▁thecatsmnodf"):
        vocab.setdefault(ch, 256 + i)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    core.normalizer = normalizers.Replace(" ", "▁")
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=core)


@pytest.fixture(scope="module", params=["byte_level_bpe", "byte_fallback"])
def tokenizer(request):
    return {"byte_level_bpe": _byte_level_bpe, "byte_fallback": _byte_fallback}[request.param]()


def _joined(shown):
    return "".join(t or "" for t in shown)


@pytest.mark.parametrize("text", TEXTS)
def test_displayed_completion_equals_decoded_text(tokenizer, text):
    ids = tokenizer.encode(text)
    stored = [piece_text(tokenizer, i) for i in ids]  # what the recorder writes to the token column
    assert any("<0x" in s for s in stored)  # the tokenizer really splits characters into bytes
    shown = merge_tokens(stored)
    assert _joined(shown) == tokenizer.decode(ids) == text
    assert not any("<0x" in s for s in shown if s)  # every byte joined a character
    # a character is drawn on the token holding its last byte; its earlier tokens are continuations
    for ch in ("😀", "語"):
        if ch in text:
            at, k = shown.index(ch), len(ch.encode()) - 1
            assert "".join(stored[at - k : at + 1]) == "".join(f"<0x{b:02X}>" for b in ch.encode())
            assert shown[at - k : at] == [None] * k


def test_raw_byte_level_pieces_read_as_text():
    tok = _byte_level_bpe()
    for text in TEXTS:
        raw = tok.convert_ids_to_tokens(tok.encode(text))  # 'Ġä¸Ńæĸĩ', 'ð', 'Ł', 'ĺ', 'Ģ'
        assert _joined(merge_tokens(raw)) == text
    assert readable_token("Ġä¸Ńæĸĩ") == " 中文" and readable_token("Ã©") == "é"


def test_attribution_by_hand():
    # 中 = E4 B8 AD, drawn on the token holding AD; the two before it are continuations
    assert merge_tokens(["<0xE4>", "<0xB8>", "<0xAD>文"]) == [None, None, "中文"]
    assert merge_tokens(["a<0xE4>", "<0xB8><0xAD>"]) == ["a", "中"]
    # a cut character (end of the completion) and an invalid sequence keep their bytes on their own tokens
    assert merge_tokens(["a", "<0xE4>", "<0xB8>"]) == ["a", "<0xE4>", "<0xB8>"]
    assert merge_tokens(["<0xE4>", "x", "<0xAD>"]) == ["<0xE4>", "x", "<0xAD>"]
    assert merge_tokens(["<0xC0>", "<0x80>"]) == ["<0xC0>", "<0x80>"]  # overlong NUL: not UTF-8
    assert merge_tokens(["<0xED>", "<0xA0>", "<0x80>"]) == ["<0xED>", "<0xA0>", "<0x80>"]  # a surrogate
    assert merge_tokens(["<0xE4>", None, "<0xAD>"]) == ["<0xE4>", "", "<0xAD>"]  # no text breaks it
    assert merge_tokens(["x", ""]) == ["x", ""]  # an empty token is not a continuation
    assert readable_token("<0xE4>") == "<0xE4>" and readable_token("<0xE4><0xB8><0xAD>") == "中"


def test_decoded_text_is_not_mistaken_for_byte_level():
    # 'é' is byte E9 in the GPT-2 table: alone it is no UTF-8, so decoded Latin-1 text stays as it is
    assert not is_byte_level(["café"]) and not is_byte_level(["ð"]) and not is_byte_level(["Ģirts"])
    assert readable_token("café") == "café" and readable_token("naïve") == "naïve"
    assert is_byte_level(["Ġthe"]) and is_byte_level(["Ã©"])


def test_context_merges_across_the_brackets():
    marks = ("⟦", "⟧")
    assert readable_text("ab<0xE4><0xB8>⟦<0xAD>⟧c", marks) == "ab⟦中⟧c"
    assert readable_text("ab⟦<0xE4>⟧<0xB8><0xAD>c", marks) == f"ab⟦{CONTINUATION}⟧中c"
    assert readable_text("x⟦<0xE4>⟧y", marks) == "x⟦<0xE4>⟧y"
    assert readable_text("no bytes ⟦here⟧") == "no bytes ⟦here⟧"


def test_read_and_record_share_one_byte_table():
    # one table (tokengrad.read.byte_table, which record/ may import: tests/import_rules.py LAYOUT)
    assert record_token_text.byte_level_table is byte_level_table
    assert sorted(byte_level_table().values()) == list(range(256))  # every byte once
    assert byte_level_table()["Ġ"] == 0x20 and byte_level_table()["Ł"] == 0x9F
