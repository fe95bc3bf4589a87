"""Word clouds of token frequencies: high- vs low-probability tokens side by side (TR-GRPO arXiv 2511.00066
Fig. 1 style).

    high = token_frequencies(run, prob_lo=0.75, prob_hi=1.0)  # tokengrad.read.queries (DuckDB)
    low = token_frequencies(run, prob_lo=0.0, prob_hi=0.25)
    fig = make_high_low_wordcloud_figure(high, low)              # plotly, two go.Image panels
    png = wordcloud_png(prepare_frequencies(high))               # or PNG bytes

Token strings are cleaned for display: raw byte-level BPE pieces are decoded ('Ġthe' is ' the', 'ä¸Ń'
is '中'; tokengrad.read.token_text), the SentencePiece ▁ becomes a space, surrounding whitespace is
stripped, and whitespace-only tokens are shown as ␣ / ↵ / ⇥ (or dropped with show_whitespace=False).
Special tokens (<|im_end|>, </s>, ...) are dropped. A character split over several tokens ('<0xE4>',
'<0xB8>', '<0xAD>') reaches the cloud whole from token_frequencies (tokengrad.read.char_frequencies:
counted once, on the token that completes it); bytes that never form a character stay '<0xE2>'. Words
are never rotated (a rotated '<' reads as 'V'). Clouds are sized by token count, or by the tokens' summed
gradient (grad_sum, the sum of logit_grad_norm) with size_by="grad_sum".
Each word is drawn in the first font that covers all its characters (tokengrad.figures.fonts.word_font:
DejaVu Sans, else Noto Sans CJK or Symbola where installed), so CJK words and emoji in one cloud both
draw; a character no font covers is written as an escape (\u4e2d), never as an empty box.
"""

from __future__ import annotations

import base64
import io
import random
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from types import FunctionType, SimpleNamespace

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.fonts import (  # noqa: F401
    DEFAULT_FONT_FAMILY,
    WordFont,
    cloud_font,
    drawable,
    find_font,
    word_font,
)
from tokengrad.figures.style import MAX_TOKEN_CHARS, cap_text, dashboard_layout, empty_figure
from tokengrad.read.display import WHITESPACE_SYMBOLS, visible_text
from tokengrad.read.token_text import readable_token
from tokengrad.schema import BIN, TOK

MARKERS = {"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"}  # byte-level BPE and SentencePiece (U+2581) markers
# inside a word: a line break would make the cloud's text multi-line, which it cannot place
INNER_SYMBOLS = {c: sym for c, sym in WHITESPACE_SYMBOLS.items() if c != " "}
SPECIAL_TOKEN = re.compile(r"^<\|?[A-Za-z0-9_./:-]*\|?>$|^</?s>$")  # <|im_end|>, <pad>, </s>, <|endoftext|>
BYTE_TOKEN = re.compile(r"^(<0x[0-9A-F]{2}>)+$")  # undecodable bytes, shown as they are
SIZE_BY = ("count", "grad_sum")
DEFAULT_STOP_TOKENS: frozenset[str] = frozenset()
HIGH_HUE, LOW_HUE = 210, 15  # blue for high-probability tokens, red-orange for low


def clean_token(token: str, *, show_whitespace: bool = True) -> str | None:
    """Display text of a token (at most MAX_TOKEN_CHARS); None when the token should not appear (empty, or
    whitespace hidden). Line breaks and tabs inside it read ↵ / ⇥, other controls, bidi overrides and
    zero-width characters as escapes (tokengrad.read.display: \\u202e)."""
    # a bounded prefix first: markers and whitespace never need more than a few characters of slack
    text = "".join(MARKERS.get(ch, ch) for ch in readable_token(str(token)[: 4 * MAX_TOKEN_CHARS]))
    stripped = text.strip()
    if stripped:
        return cap_text(visible_text(stripped, symbols=INNER_SYMBOLS))
    if not text or not show_whitespace:
        return None
    return cap_text(visible_text(text, symbols=WHITESPACE_SYMBOLS))


def prepare_frequencies(
    freqs: pd.DataFrame | Mapping[str, float],
    *,
    show_whitespace: bool = True,
    stop_tokens: Iterable[str] = DEFAULT_STOP_TOKENS,
    drop_special: bool = True,
    max_words: int | None = 200,
    size_by: str = BIN.count,
) -> dict[str, float]:
    """{display text: size} from (token, count[, grad_sum]) rows: cleaned, stop/special tokens dropped,
    merged; the size is the `size_by` column (count, or grad_sum: the tokens' summed gradient).

    Tokens that clean to the same text (e.g. 'Ġthe' and 'the') add up. A stop token matches either the
    raw or the cleaned text. Keeps the max_words largest.
    """
    if isinstance(freqs, pd.DataFrame):
        if size_by not in SIZE_BY:
            raise ValueError(f"size_by must be one of {SIZE_BY}, got {size_by!r}")
        missing = {TOK.token, size_by} - set(freqs.columns)
        if missing:
            raise ValueError(f"frequency frame needs columns token, {size_by}; missing {sorted(missing)}")
        pairs = zip(freqs[TOK.token], freqs[size_by])
    else:
        pairs = freqs.items()
    stops = set(stop_tokens)
    out: dict[str, float] = {}
    for token, count in pairs:
        token = "" if token is None else str(token)
        special = SPECIAL_TOKEN.match(token.strip()) and not BYTE_TOKEN.match(token.strip())
        if token in stops or (drop_special and special):
            continue
        text = clean_token(token, show_whitespace=show_whitespace)
        if text is None or text in stops or not count or not count > 0:
            continue
        out[text] = out.get(text, 0.0) + float(count)
    ranked = sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))
    return dict(ranked[:max_words] if max_words else ranked)


def _hue_color_func(hue: int):
    """wordcloud colour function: one hue, lightness 22-45% drawn from wordcloud's seeded random_state."""

    def color(word, font_size, position, orientation, random_state=None, **kwargs):
        rng = random_state or random.Random(0)
        return f"hsl({hue}, 75%, {rng.randint(22, 45)}%)"

    return color


@lru_cache(maxsize=1)
def _per_word_cloud():
    """wordcloud.WordCloud whose layout and drawing open a fonts.WordFont where the library opens its one
    font file (`ImageFont.truetype(self.font_path, size)`): the library's own two methods, run with
    ImageFont bound to a namespace that makes WordFonts, so every word is measured and drawn in its own
    font (tests/figures/test_wordcloud_fonts.py checks the glyphs drawn)."""
    from PIL import ImageFont
    from wordcloud import WordCloud
    from wordcloud import wordcloud as library

    opener = SimpleNamespace(
        truetype=lambda path, size: WordFont(size), TransposedFont=ImageFont.TransposedFont
    )
    scope = {**vars(library), "ImageFont": opener}

    def rebound(f):
        g = FunctionType(f.__code__, scope, f.__name__, f.__defaults__, f.__closure__)
        g.__kwdefaults__ = f.__kwdefaults__
        return g

    methods = ("generate_from_frequencies", "to_image")
    return type("PerWordCloud", (WordCloud,), {m: rebound(getattr(WordCloud, m)) for m in methods})


def _cloud(
    freqs: Mapping[str, float], *, width: int, height: int, hue: int, seed: int, font_path: str | None
):
    """The laid-out cloud: each word in its own font (fonts.word_font), or all in `font_path` if given."""
    from wordcloud import WordCloud

    kind = WordCloud if font_path else _per_word_cloud()
    wc = kind(
        width=width,
        height=height,
        background_color="white",
        font_path=str(font_path or find_font()),
        random_state=seed,
        color_func=_hue_color_func(hue),
        prefer_horizontal=1.0,
        max_words=max(len(freqs), 1),
        relative_scaling=0.5,
        collocations=False,
    )
    capped: dict[str, float] = {}  # freqs that did not come through prepare_frequencies: made visible here
    for word, size in freqs.items():
        shown = cap_text(visible_text(str(word)[: 4 * MAX_TOKEN_CHARS], symbols=INNER_SYMBOLS))
        shown = drawable(shown, font_path or word_font(shown))
        capped[shown] = capped.get(shown, 0.0) + size
    return wc.generate_from_frequencies(capped)


def wordcloud_array(
    freqs: Mapping[str, float],
    *,
    width: int = 800,
    height: int = 400,
    hue: int = HIGH_HUE,
    seed: int = 0,
    font_path: str | None = None,
) -> np.ndarray:
    """The word cloud as an RGB image [height, width, 3] uint8; all white when `freqs` is empty."""
    if not freqs:
        return np.full((height, width, 3), 255, dtype=np.uint8)
    wc = _cloud(freqs, width=width, height=height, hue=hue, seed=seed, font_path=font_path)
    return np.asarray(wc.to_array(), dtype=np.uint8)


def wordcloud_png(
    freqs: Mapping[str, float],
    *,
    width: int = 800,
    height: int = 400,
    hue: int = HIGH_HUE,
    seed: int = 0,
    font_path: str | None = None,
) -> bytes:
    """The word cloud as PNG bytes."""
    from PIL import Image

    buf = io.BytesIO()
    arr = wordcloud_array(freqs, width=width, height=height, hue=hue, seed=seed, font_path=font_path)
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def make_wordcloud_figure(
    panels: Mapping[str, pd.DataFrame | Mapping[str, float]],
    *,
    hues: Iterable[int] | None = None,
    width: int = 800,
    height: int = 400,
    show_whitespace: bool = True,
    stop_tokens: Iterable[str] = DEFAULT_STOP_TOKENS,
    max_words: int = 200,
    seed: int = 0,
    size_by: str = BIN.count,
    title: str | None = None,
) -> go.Figure:
    """One word cloud per panel (panel title -> (token, count) frame), side by side as go.Image traces.

    Each image is embedded as a PNG data URI (compact, and rendered by the browser and by kaleido).
    """
    if not panels:
        return empty_figure("no token frequencies", title)
    hues = (
        list(hues)
        if hues is not None
        else [HIGH_HUE, LOW_HUE][: len(panels)] + [HIGH_HUE] * (len(panels) - 2)
    )
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=list(panels), horizontal_spacing=0.02)
    for j, ((name, freqs), hue) in enumerate(zip(panels.items(), hues)):
        words = prepare_frequencies(
            freqs,
            show_whitespace=show_whitespace,
            stop_tokens=stop_tokens,
            max_words=max_words,
            size_by=size_by,
        )
        png = wordcloud_png(words, width=width, height=height, hue=hue, seed=seed)
        fig.add_trace(
            go.Image(
                source="data:image/png;base64," + base64.b64encode(png).decode("ascii"),
                name=name,
                hoverinfo="skip",
                zsmooth="fast",
            ),
            row=1,
            col=j + 1,
        )
        if not words:
            fig.add_annotation(
                text="no tokens",
                showarrow=False,
                x=width / 2,
                y=height / 2,
                xref=f"x{j + 1 if j else ''}",
                yref=f"y{j + 1 if j else ''}",
            )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return dashboard_layout(fig, title, height=int(height * 0.6) + 80)


def make_high_low_wordcloud_figure(
    high: pd.DataFrame,
    low: pd.DataFrame,
    *,
    titles: tuple[str, str] = ("high-probability tokens", "low-probability tokens"),
    **kwargs,
) -> go.Figure:
    """High- (blue) and low-probability (red) token clouds side by side (TR-GRPO Fig. 1 style)."""
    return make_wordcloud_figure({titles[0]: high, titles[1]: low}, hues=[HIGH_HUE, LOW_HUE], **kwargs)
