"""Token text: bytes a lone vocabulary piece cannot decode are shown as <0xNN>, never as U+FFFD."""

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
