"""Recorded text made safe to show: characters that would act instead of read are written as escapes.

    visible_text("abc\u202edef")          # 'abc\\u202edef': a right-to-left override shown, not obeyed
    visible_text("\x1b[31mred")           # '\\x1b[31mred': a terminal escape shown, not run
    visible_text("a\nb", keep="\n")       # 'a\nb': line breaks kept where the page lays out lines
    visible_text("a\nb", symbols={"\n": "↵"})  # 'a↵b': or drawn as a symbol (WHITESPACE_SYMBOLS)
    slug("seed 0/run", "run")               # 'seed_0_run': a name as a file-name stem

Token text, completions, run and folder names come from models and file systems: a bidi override
(U+202E, U+200F, U+2066...) reverses what follows it, a C0/C1 control or an ANSI sequence (ESC [ ...)
recolours or rewrites a terminal, a zero-width character (U+200B, U+FEFF) hides a difference between two
tokens. Every character of the Unicode categories Cc (controls), Cf (format: bidi marks and overrides,
zero-width characters), Zl / Zp (line and paragraph separators), Cs (lone surrogates), Co (private use)
and Cn (unassigned) is written as \\xNN, \\uNNNN or \\UNNNNNNNN, and \\n, \\t, \\r as those two
characters. Ordinary non-ASCII text (accents, CJK, Arabic and Hebrew letters, emoji) is left alone, and so
is the zero-width joiner inside an emoji sequence (👩‍💻). A backslash already in the text is not doubled:
the text stays readable, at the cost of a literal '\\x1b' reading like an escaped ESC.

Standard library only, so that the dashboard, the CLI, the figures and the doctor can all use it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping

HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
ZWJ = "\u200d"
# A whitespace character drawn as a symbol where it would otherwise be invisible or break a layout (the
# inspector's tokens, word-cloud entries); each view picks the characters it draws this way.
WHITESPACE_SYMBOLS = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "↵"}
_SKIN_TONES = range(0x1F3FB, 0x1F400)  # Fitzpatrick modifiers (category Sk), which may precede a ZWJ
_VS16 = "\ufe0f"  # emoji presentation selector, which may precede a ZWJ


def escape_char(ch: str) -> str:
    """One character as a Python-style escape: \\n, \\t, \\r, else \\xNN, \\uNNNN or \\UNNNNNNNN."""
    if ch in SHORT_ESCAPES:
        return SHORT_ESCAPES[ch]
    cp = ord(ch)
    return f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}"


def is_hidden(ch: str) -> bool:
    """True for a character that acts (control, format, separator) or has no glyph of its own."""
    return unicodedata.category(ch) in HIDDEN_CATEGORIES


def _emoji_joiner(text: str, i: int) -> bool:
    """The ZWJ at text[i] joins two emoji (👩‍💻, 👨🏽‍🚀): it draws one glyph, so it stays."""
    if i == 0 or i + 1 >= len(text):
        return False
    before, after = text[i - 1], text[i + 1]
    emoji_before = unicodedata.category(before) == "So" or before == _VS16 or ord(before) in _SKIN_TONES
    return emoji_before and unicodedata.category(after) == "So"


def visible_text(text: object, *, keep: str = "", symbols: Mapping[str, str] | None = None) -> str:
    """`text` (str() of anything else; '' for None) with every hidden character shown as an escape.

    Args:
        keep: characters left as they are (e.g. "\\n" where the page lays out lines itself).
        symbols: character -> replacement drawn instead of its escape (e.g. {"\\n": "↵"}).
    """
    text = "" if text is None else str(text)
    symbols = symbols or {}
    if text.isprintable() and not any(ch in symbols for ch in text):
        return text  # the common case: nothing to change (isprintable is False for every hidden class)
    out = []
    for i, ch in enumerate(text):
        if ch in symbols:
            out.append(symbols[ch])
        elif ch in keep or not is_hidden(ch) or (ch == ZWJ and _emoji_joiner(text, i)):
            out.append(ch)
        else:
            out.append(escape_char(ch))
    return "".join(out)


def visible_lines(text: object) -> str:
    """visible_text keeping line breaks and tabs: prompts, completions and messages shown as blocks."""
    return visible_text(text, keep="\n\t")


def slug(text: str, default: str, keep: str = "") -> str:
    """`text` as a file-name stem: each run of characters other than ASCII letters, digits, '_', '-' and
    `keep` becomes one '_', leading and trailing '_' dropped; `default` when nothing is left."""
    return re.sub(f"[^A-Za-z0-9_{re.escape(keep)}-]+", "_", text).strip("_") or default
