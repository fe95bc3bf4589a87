"""Token text as people read it: bytes split over several tokens merged back into characters, for display.

The token table stores each token's own text (tokengrad.record.token_text): a byte that is not text on its
own is spelt '<0xNN>', so a 3-byte character such as '中' (E4 B8 AD) that a byte-level tokenizer split
over three tokens is stored '<0xE4>', '<0xB8>', '<0xAD>'. Runs written by other tools may instead hold
raw byte-level BPE pieces (GPT-2, Llama 3, SmolLM2: every byte spelt as one printable character by the
GPT-2 byte-to-character table, 'Ġ' for a space, 'ä¸Ń' for '中'). For display both are turned back into
characters here; the stored ids and pieces stay as they are.

A character spanning several tokens is shown whole on the token that completes it (holds its last
byte); the tokens holding only its earlier bytes are continuations, shown as CONTINUATION ('◌'). Bytes
that never complete a character (an invalid sequence, or a completion cut mid-character) stay '<0xNN>'
on their own token. Joining every token's display text (continuations as '') gives the decoded text.

    merge_tokens(["<0xE4>", "<0xB8>", "<0xAD>", "文"])   # [None, None, '中', '文']: None = continuation
    readable_token("Ġthe")                                  # ' the' (a raw byte-level piece)
    readable_text("a<0xE4><0xB8><0xAD>b")                   # 'a中b' (a context or evidence string)

Standard library only (the dashboard, the figures and the doctor use it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tokengrad.read.byte_table import byte_level_table

BYTE_SPELLING = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback / the recorder's spelling
CONTINUATION = "◌"  # a token whose bytes belong to a character shown on a later token
SPLIT_NOTE = "a split character"  # evidence_text's mark on a token holding part of one
_SHIFTED = range(0x100, 0x144)  # the table's stand-ins for unprintable bytes ('Ġ' = space, 'Ċ' = newline)


def _utf8_prefix_ok(data: bytes) -> bool:
    """True when `data` is valid UTF-8, or valid but for a character cut at the end."""
    for cut in range(min(4, len(data)) + 1):
        try:
            data[: len(data) - cut].decode("utf-8")
            return True
        except UnicodeDecodeError:
            continue
    return False


def is_byte_level(texts: Sequence[str]) -> bool:
    """True when `texts` read as raw byte-level BPE pieces: every character is in the GPT-2 table, and
    either one is a stand-in for an unprintable byte ('Ġ', 'Ł'...) and the bytes are UTF-8 (a character
    cut at the end allowed), or the bytes are UTF-8 holding a multi-byte character ('Ã©' for 'é').
    Decoded text rarely passes: 'café' maps to 63 61 66 E9, which is not UTF-8."""
    joined = "".join(texts)
    table = byte_level_table()
    if not joined or joined.isascii() or any(c not in table for c in joined):
        return False
    data = bytes(table[c] for c in joined)
    if any(ord(c) in _SHIFTED for c in joined):
        return _utf8_prefix_ok(data)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def token_bytes(text: str, *, byte_level: bool = False) -> bytes:
    """The bytes a stored token text stands for: '<0xNN>' as that byte, the rest as UTF-8 (or through
    the GPT-2 table when `byte_level`)."""
    table = byte_level_table()
    out, at = bytearray(), 0
    for m in BYTE_SPELLING.finditer(text):
        out += _plain_bytes(text[at : m.start()], byte_level, table)
        out.append(int(m.group(1), 16))
        at = m.end()
    out += _plain_bytes(text[at:], byte_level, table)
    return bytes(out)


def _plain_bytes(text: str, byte_level: bool, table: dict[str, int]) -> bytes:
    return bytes(table[c] for c in text) if byte_level else text.encode("utf-8", "surrogatepass")


def _lead_length(b: int) -> int:
    """Bytes in the UTF-8 character that starts with byte b: 1 (ASCII), 2-4, or 0 (not a start byte)."""
    if b < 0x80:
        return 1
    return 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0


class _Merger:
    """Walks the bytes of a token sequence; out[i] collects the characters drawn on token i."""

    def __init__(self, n: int):
        self.out: list[list[str]] = [[] for _ in range(n)]
        self.pending: list[tuple[int, int]] = []  # (token index, byte) of an unfinished character
        self.need = 0
        self.split: list[list[tuple[str, int, int]]] = [[] for _ in range(n)]  # (char, k, n) per token

    def flush(self) -> None:
        """The unfinished character never completes: each byte back on its own token as <0xNN>."""
        for i, b in self.pending:
            self.out[i].append(f"<0x{b:02X}>")
        self.pending, self.need = [], 0

    def feed(self, i: int, b: int) -> None:
        if self.need and 0x80 <= b <= 0xBF:
            self.pending.append((i, b))
            self.need -= 1
            if not self.need:
                self._complete(i)
            return
        self.flush()
        size = _lead_length(b)
        if size == 1:
            self.out[i].append(chr(b))
        elif size:
            self.pending, self.need = [(i, b)], size - 1
        else:
            self.out[i].append(f"<0x{b:02X}>")

    def _complete(self, i: int) -> None:
        try:
            ch = bytes(b for _, b in self.pending).decode("utf-8")  # rejects overlongs and surrogates
        except UnicodeDecodeError:
            self.flush()
            return
        self.out[i].append(ch)
        held = sorted({j for j, _ in self.pending})
        if len(held) > 1:  # a character split over tokens: each holder learns which part it holds
            for k, j in enumerate(held, 1):
                self.split[j].append((ch, k, len(held)))
        self.pending = []


def _merged(texts: list[str]) -> _Merger:
    byte_level = is_byte_level(texts)
    merger = _Merger(len(texts))
    for i, text in enumerate(texts):
        data = token_bytes(text, byte_level=byte_level)
        if not data:
            merger.flush()
        for b in data:
            merger.feed(i, b)
    merger.flush()
    return merger


def _shown(texts: list[str], merger: _Merger) -> list[str | None]:
    held = {i for i, t in enumerate(texts) if t}
    return ["".join(parts) if parts or i not in held else None for i, parts in enumerate(merger.out)]


def merge_tokens(texts: Sequence[str | None]) -> list[str | None]:
    """Display text of each token of one sequence, multi-byte characters merged onto the token that
    completes them; None for a continuation token (all its bytes belong to a later token's character).
    A missing text (None) stays '' and breaks any character across it."""
    texts = ["" if t is None else str(t) for t in texts]
    if not any("<0x" in t or not t.isascii() for t in texts):
        return list(texts)  # the common case: ASCII text, nothing to merge
    return _shown(texts, _merged(texts))


def split_parts(texts: Sequence[str | None]) -> list[list[tuple[str, int, int]]]:
    """For each token of one sequence, the characters split over several tokens that it holds bytes of,
    as (character, k, n): the token is the k-th of the n tokens holding it. [] for a token whose every
    character lies whole inside it."""
    texts = ["" if t is None else str(t) for t in texts]
    if not any("<0x" in t or not t.isascii() for t in texts):
        return [[] for _ in texts]
    return _merged(texts).split


def evidence_text(texts: Sequence[str | None], at: int) -> str:
    """Token `at` of a window of one sequence's token texts (its neighbours give the bytes it shares a
    character with), as a finding names it: a token holding part of a character split over tokens reads
    as that whole character, marked, '中 (token 1 of 3 of a split character)'; a token that also
    completes or begins other characters shows them too ('中文 (token 3 of 3 of 中, a split character)').
    Other tokens read as readable_token reads them."""
    texts = ["" if t is None else str(t) for t in texts]
    if not any("<0x" in t or not t.isascii() for t in texts):
        return texts[at]
    merger = _merged(texts)
    parts, own = merger.split[at], _shown(texts, merger)[at] or ""
    if not parts:
        return own
    # the characters it does not complete are drawn on later tokens (merge_tokens): shown here too
    shown = own + "".join(c for c, k, n in parts if k < n)
    if len(parts) == 1:
        c, k, n = parts[0]
        return f"{shown} (token {k} of {n} of {SPLIT_NOTE if shown == c else f'{c}, {SPLIT_NOTE}'})"
    where = ", ".join(f"token {k} of {n} of {c}" for c, k, n in parts)
    return f"{shown} ({where}: split characters)"


def readable_token(text: str | None) -> str:
    """One token on its own (a word cloud entry, a culprit in a finding): raw byte-level pieces and
    '<0xNN>' runs that form whole characters decoded; a part-character stays '<0xNN>'."""
    if text is None:
        return ""
    return merge_tokens([text])[0] or ""


def readable_text(text: str | None, marks: tuple[str, str] | None = None) -> str:
    """A string joined from token texts (the inspector's context column, doctor evidence) with its
    '<0xNN>' runs merged into characters where they form them.

    `marks` (open, close) bracket one token inside the string (top_tokens' '⟦token⟧'): the three parts
    are merged as one sequence, so a character split across the bracket is drawn on the token that
    completes it, and a bracketed continuation token reads '⟦◌⟧'.
    """
    if text is None:
        return ""
    if "<0x" not in text:
        return text
    open_, close = marks or ("", "")
    if not marks or open_ not in text or close not in text.split(open_, 1)[1]:
        return "".join(p or "" for p in merge_tokens([text]))
    before, rest = text.split(open_, 1)
    token, after = rest.split(close, 1)
    before, token, after = merge_tokens([before, token, after])
    return f"{before or ''}{open_}{CONTINUATION if token is None else token}{close}{after or ''}"
