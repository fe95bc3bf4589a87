"""A word cloud mixing CJK words and emoji draws both: each word in the first font that covers all its
characters (tokengrad.figures.fonts.word_font, WordFont), not the whole cloud in one font."""

import numpy as np
import pytest

from tokengrad.figures import fonts
from tokengrad.figures.wordclouds import _cloud

CJK = next((p for p in fonts.candidate_fonts() if "CJK" in p), None)
WORDS = {"中文": 5.0, "日本語": 4.0, "😀": 3.0, "🚀": 2.0, "the": 2.0}  # mostly CJK, two emoji, one Latin

needs_fonts = pytest.mark.skipif(
    CJK is None or len(fonts.candidate_fonts()) < 3,
    reason="needs Noto Sans CJK and Symbola (apt-get install -y fonts-noto-cjk fonts-symbola; setup.sh does)",
)


@needs_fonts
def test_each_word_gets_a_font_that_covers_it():
    picked = {w: fonts.word_font(w) for w in WORDS}
    for word, path in picked.items():
        assert all(ord(c) in fonts.coverage(path) for c in word), (word, path)
    assert picked["中文"] == picked["日本語"] == CJK and picked["the"] == fonts.find_font()
    assert 0x1F600 not in fonts.coverage(CJK)  # the one-font cloud (cloud_font picks CJK) lacks the emoji
    assert fonts.cloud_font(WORDS) == CJK and picked["😀"] != CJK and picked["🚀"] != CJK


def _ink(img):
    return np.asarray(img.convert("L")) < 200


def _glyph(word, path, size):
    """`word` drawn alone with Pillow in the font at `path`, at (0, 0) as the cloud draws it there."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.TransposedFont(ImageFont.truetype(path, size))  # wordcloud draws through one
    box = ImageDraw.Draw(Image.new("L", (1, 1))).textbbox((0, 0), word, font=font)
    img = Image.new("L", (box[2] + 1, box[3] + 1), 255)
    ImageDraw.Draw(img).text((0, 0), word, fill=0, font=font)
    return _ink(img)


@needs_fonts
def test_mixed_cloud_draws_every_word_in_its_font():
    wc = _cloud(WORDS, width=500, height=250, hue=210, seed=0, font_path=None)
    drawn = np.pad(_ink(wc.to_image()), ((0, 200), (0, 400)))  # a glyph's box may pass the edge
    placed = {word: (size, pos) for (word, _), size, pos, _, _ in wc.layout_}
    assert set(placed) == set(WORDS)  # every word placed, none written as an escape
    for word, (size, (row, col)) in placed.items():
        want = _glyph(word, fonts.word_font(word), size)
        got = drawn[row : row + want.shape[0], col : col + want.shape[1]]
        assert want.sum() > 20 and (got & want).sum() / (got | want).sum() > 0.9, word
        if word in ("😀", "🚀"):  # the CJK font would draw its empty box here instead
            box = _glyph(word, CJK, size)
            here = drawn[row : row + box.shape[0], col : col + box.shape[1]]
            assert (here & box).sum() / (here | box).sum() < 0.5, word
