"""The font a word cloud is drawn in: of the fonts present, the one that draws most of its characters.

    path = cloud_font(["中文", "the", "😀"])       # Noto Sans CJK when installed, else DejaVu Sans
    word = drawable("中😀", path)                 # '中\\U0001f600': a character the font lacks, as an escape

wordcloud draws every word with one TrueType font through Pillow, which has no fallback: a character the
font lacks is an empty box. The candidates, in order of preference: DejaVu Sans (bundled with matplotlib:
Latin, Greek, Cyrillic, math symbols), Noto Sans CJK (Debian fonts-noto-cjk: Chinese, Japanese, Korean)
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


def drawable(word: str, path: str) -> str:
    """`word` with each character the font at `path` lacks written as an escape (a space stays)."""
    cmap = coverage(path)
    return "".join(
        c if c.isspace() or ord(c) in cmap else "" if c in JOINERS else escape_char(c) for c in word
    )
