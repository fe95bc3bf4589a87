"""The text of one vocabulary entry, with bytes that are not text on their own shown as <0xNN>.

A byte-level BPE vocabulary (GPT-2, Llama 3, Qwen, SmolLM) splits a multi-byte character such as 'é' or
'—' over several tokens; `tokenizer.decode([id])` of one such piece gives U+FFFD, which hides which byte
it was. The raw vocabulary string keeps it: byte-level BPE spells every byte as one printable character
(the GPT-2 byte-to-character table: printable Latin-1 bytes stand for themselves, the other 68 bytes for
U+0100 onwards, in byte order), and SentencePiece's byte fallback spells it '<0xNN>' already.

    piece_text(tokenizer, token_id)     # 'é' stays 'é'; a lone lead byte of '—' reads '<0xE2>'
"""

from __future__ import annotations

import re
import warnings

from tokengrad.read.byte_table import byte_level_table

REPLACEMENT = "\ufffd"
BYTE_PIECE = re.compile(r"^(<0x[0-9A-Fa-f]{2}>)+$")


def bytes_text(data: bytes) -> str:
    """UTF-8 text of `data`, each byte that does not decode shown as <0xNN>."""
    text = data.decode("utf-8", errors="surrogateescape")  # undecodable bytes -> U+DC80..U+DCFF
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def piece_text(tokenizer, token_id: int) -> str:
    """decode([token_id]), or, where that hides a byte behind U+FFFD, the byte spelt <0xNN>."""
    text = tokenizer.decode([token_id])
    if REPLACEMENT not in text or not hasattr(tokenizer, "convert_ids_to_tokens"):
        return text
    raw = tokenizer.convert_ids_to_tokens(token_id)
    if not isinstance(raw, str):
        return text
    if BYTE_PIECE.match(raw):  # SentencePiece byte fallback
        return re.sub(r"0x([0-9A-Fa-f]{2})", lambda m: "0x" + m.group(1).upper(), raw)
    table = byte_level_table()
    if raw and all(c in table for c in raw):  # byte-level BPE
        return bytes_text(bytes(table[c] for c in raw))
    return text


def safe_text(text: str, where: str) -> str:
    """`text` as it can be stored (Parquet text is UTF-8): a lone surrogate, e.g. an undecodable byte that
    surrogateescape turned into U+DC80..U+DCFF, is kept as its backslash escape (`\\udcff`), with a
    warning naming `where`, instead of failing the whole table on the writer thread."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        warnings.warn(
            f"tokengrad: {where} holds text that is not valid UTF-8 ({text[:40]!r}); stored with "
            "backslash escapes",
            RuntimeWarning,
            stacklevel=4,
        )
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
