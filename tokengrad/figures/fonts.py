"""The fonts a word cloud is drawn in: each word in the first font present that draws all its characters.

    path = word_font("中文")                      # Noto Sans CJK when installed, else DejaVu Sans
    path = cloud_font(["中文", "the", "😀"])       # one font for a whole list: the one drawing the most
    word = drawable("中😀", path)                 # '中\\U0001f600': a character the font lacks, as an escape
    font = WordFont(size=40)                       # a Pillow font of one size, each word in its word_font

wordcloud draws every word with one TrueType font through Pillow, which has no fallback: a character the
font lacks is an empty box. So a cloud hands wordcloud a WordFont, which measures and draws each word in
the font word_font picks for it (a mostly-CJK cloud draws its emoji words in DejaVu Sans or Symbola).
The candidates, in order of preference: DejaVu Sans (bundled with matplotlib: Latin, Greek, Cyrillic,
math symbols, some emoji), Noto Sans CJK (Debian fonts-noto-cjk: Chinese, Japanese, Korean)
and Symbola (Debian fonts-symbola: emoji as outlines; Noto Color Emoji is a fixed-size bitmap font that
Pillow cannot scale). scripts/setup.sh installs the two Debian packages where it can. Characters the
chosen font still lacks are written as escapes (tokengrad.read.display.escape_char), never as boxes.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from tokengrad.read.display import escape_char

DEFAULT_FONT_FAMILY = "DejaVu Sans"
# Debian file names of the fallback fonts (fonts-noto-cjk; fonts-symbola), alternatives in order, found by
# a scan of the system font folders (matplotlib's cached font list misses fonts installed after it)
FALLBACK_FILES = (("NotoSansCJK-Regular.ttc",), ("Symbola_hint.ttf", "Symbola.ttf"))
# no glyph of their own: left out where the font lacks them (an emoji sequence draws as its parts)
JOINERS = frozenset({"\u200d", "\ufe0f", "\ufe0e"})


@lru_cache(maxsize=8)
def find_font(family: str = DEFAULT_FONT_FAMILY) -> str:
    """Path of a TTF for `family` via matplotlib.font_manager (falls back to matplotlib's default font)."""
    from matplotlib import font_manager

    return font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=True)


@lru_cache(maxsize=1)
def candidate_fonts() -> tuple[str, ...]:
    """Paths of the candidate fonts present, in order of preference (DejaVu Sans always)."""
    from matplotlib import font_manager

    found = {Path(p).name: p for p in font_manager.findSystemFonts()}
    picked = (next((found[n] for n in names if n in found), None) for names in FALLBACK_FILES)
    return (find_font(), *(p for p in picked if p))


@lru_cache(maxsize=8)
def coverage(path: str) -> frozenset[int]:
    """The code points `path` (the first font of a .ttc collection) has a glyph for."""
    from fontTools.ttLib import TTFont

    with TTFont(path, fontNumber=0, lazy=True) as font:
        return frozenset(font.getBestCmap() or {})


def cloud_font(words: Iterable[str]) -> str:
    """The candidate font that draws the most characters of `words` (ties: the earlier candidate)."""
    chars = [ord(c) for w in words for c in str(w) if not c.isspace()]
    best, best_n = None, -1
    for path in candidate_fonts():
        n = sum(cp in coverage(path) for cp in chars) if chars else 0
        if n > best_n:
            best, best_n = path, n
    return best


def _drawn(word: str) -> list[int]:
    return [ord(c) for c in str(word) if not c.isspace() and c not in JOINERS]


@lru_cache(maxsize=4096)
def word_font(word: str) -> str:
    """The first candidate font that draws every character of `word`; where none does, the one drawing
    the most (ties: the earlier candidate). The characters it lacks read as escapes (drawable)."""
    chars, fonts = _drawn(word), candidate_fonts()
    for path in fonts:
        if all(cp in coverage(path) for cp in chars):
            return path
    return max(fonts, key=lambda p: (sum(cp in coverage(p) for cp in chars), -fonts.index(p)))


@lru_cache(maxsize=256)
def _truetype(path: str, size: int):
    from PIL import ImageFont

    return ImageFont.truetype(path, size)


class WordFont:
    """A Pillow font of one size that measures and draws each text in its word_font: what wordcloud asks
    of a font (getbbox, getlength, getmask through ImageFont.TransposedFont), forwarded per word."""

    def __init__(self, size: int):
        self.size = int(size)

    def font(self, text: str):
        return _truetype(word_font(str(text)), self.size)

    def getbbox(self, text, *args, **kwargs):
        return self.font(text).getbbox(text, *args, **kwargs)

    def getlength(self, text, *args, **kwargs):
        return self.font(text).getlength(text, *args, **kwargs)

    def getmask(self, text, *args, **kwargs):
        return self.font(text).getmask(text, *args, **kwargs)

    def getmask2(self, text, *args, **kwargs):
        return self.font(text).getmask2(text, *args, **kwargs)


def drawable(word: str, path: str) -> str:
    """`word` with each character the font at `path` lacks written as an escape (a space stays)."""
    cmap = coverage(path)
    return "".join(
        c if c.isspace() or ord(c) in cmap else "" if c in JOINERS else escape_char(c) for c in word
    )
