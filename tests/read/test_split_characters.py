"""Characters split over several tokens, read back whole: the inspector's boxes, the word-cloud counts
(tokengrad.read.char_frequencies) and the word-cloud font (tokengrad.figures.fonts)."""

import json

import numpy as np
import pytest
from test_queries import _token_rows, _write

from tokengrad import load_run, schema
from tokengrad.figures import fonts
from tokengrad.figures.tokens import PART_NOTE, token_html
from tokengrad.figures.wordclouds import prepare_frequencies, wordcloud_array
from tokengrad.read.queries import sample_tokens, token_frequencies, top_tokens

VOCAB = ("<0xE4>", "<0xB8>", "<0xAD>", "文")
# 中 = E4 B8 AD. Sample 0 writes 中文, sample 1 writes 中 and a lead byte the completion cut off.
#            sample  pos token    prob  adv  coef in_loss
SPEC = [
    (0, 0, "<0xE4>", 0.10, 1.0, 0.5, True),
    (0, 1, "<0xB8>", 0.20, 1.0, 0.5, True),
    (0, 2, "<0xAD>", 0.90, 1.0, 0.5, True),
    (0, 3, "文", 0.95, 1.0, 0.5, True),
    (1, 0, "<0xE4>", 0.10, 1.0, 0.5, True),
    (1, 1, "<0xB8>", 0.20, 1.0, 0.5, True),
    (1, 2, "<0xAD>", 0.30, 1.0, 0.5, True),
    (1, 3, "<0xE4>", 0.90, 1.0, 0.5, True),
]


def _norm(p):  # logit_grad_norm as test_queries._token_rows writes it: |coef| * sqrt(2) (1 - p) 0.9
    return 0.5 * np.sqrt(2.0) * (1 - p) * 0.9


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("cjk")
    meta = {"schema_version": schema.SCHEMA_VERSION, "run_name": "cjk"}
    (run_dir / schema.META_FILE).write_text(json.dumps(meta))
    _write(run_dir, "tokens", _token_rows(0, 0, SPEC, vocab=VOCAB))
    return load_run(run_dir)


def _counts(df):
    return dict(zip(df["token"], df["count"]))


def test_word_cloud_counts_a_split_character_once_on_its_last_token(run):
    # continuations (positions 0, 1) leave; 中 counts on the token holding AD; the cut lead byte stays
    assert _counts(token_frequencies(run)) == {"中": 2, "<0xE4>": 1, "文": 1}
    # the completing token's probability decides the band: 0.90 (sample 0) and 0.30 (sample 1)
    assert _counts(token_frequencies(run, 0.75, 1.0)) == {"<0xE4>": 1, "中": 1, "文": 1}
    assert _counts(token_frequencies(run, 0.25, 0.5)) == {"中": 1}
    assert _counts(token_frequencies(run, 0.0, 0.25)) == {}  # only continuations: nothing to draw
    grad = token_frequencies(run).set_index("token")["grad_sum"]
    assert grad["中"] == pytest.approx(_norm(0.90) + _norm(0.30))
    assert list(prepare_frequencies(token_frequencies(run))) == ["中", "<0xE4>", "文"]


def test_inspector_draws_the_character_on_the_token_that_completes_it(run):
    html = token_html(sample_tokens(run, step=0, sample_id=0))
    boxes = [part.split(">", 1)[1].split("</span>")[0] for part in html.split('<span class="tg-tok"')[1:]]
    assert boxes == ["◌", "◌", "中", "文"]
    assert html.count(PART_NOTE.strip()) == 2 and "token &#x27;&lt;0xE4&gt;&#x27;" in html  # hover: raw
    cut = token_html(sample_tokens(run, step=0, sample_id=1))
    assert "&lt;0xE4&gt;</span>" in cut  # the cut lead byte keeps its own spelling


def test_top_tokens_context_is_merged_by_the_inspector(run):
    from tokengrad.read.queries import CONTEXT_MARKS
    from tokengrad.read.token_text import readable_text

    ctx = top_tokens(run, step=0, k=8).set_index(["sample_id", "position"])["context"]
    assert readable_text(ctx[(0, 2)], CONTEXT_MARKS) == "⟦中⟧文"
    assert readable_text(ctx[(0, 0)], CONTEXT_MARKS) == "⟦◌⟧中文"


def _ink(rgb):
    """Boolean mask of the word's pixels (the high-probability hue is blue), cropped to their box and
    resampled to 32 x 32."""
    from PIL import Image

    arr = np.asarray(rgb, dtype=int)
    mask = (arr[..., 2] - arr[..., 0]) > 40
    ys, xs = np.nonzero(mask)
    assert len(ys), "nothing drawn"
    box = mask[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1]
    return np.asarray(Image.fromarray(box.astype(np.uint8) * 255).resize((32, 32))) > 127


def _reference(font_path):
    """'中' drawn in blue with PIL in the font at `font_path`."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (300, 300), "white")
    ImageDraw.Draw(img).text((20, 20), "中", font=ImageFont.truetype(str(font_path), 200), fill=(20, 60, 200))
    return _ink(img)


def _iou(a, b):
    return (a & b).sum() / (a | b).sum()


needs_cjk_font = pytest.mark.skipif(
    not any("CJK" in p for p in fonts.candidate_fonts()),
    reason="no CJK font (apt-get install -y fonts-noto-cjk; scripts/setup.sh does)",
)


@needs_cjk_font
def test_cjk_cloud_picks_a_font_that_draws_it():
    cjk = fonts.cloud_font(["中"])
    assert "CJK" in cjk and fonts.cloud_font(["the"]) == fonts.find_font()  # Latin stays in DejaVu Sans
    drawn = _ink(wordcloud_array({"中": 1.0}))
    # the cloud's glyph matches 中 in the CJK font, not the empty box DejaVu Sans draws for it
    assert _iou(drawn, _reference(cjk)) > 0.6 > _iou(drawn, _reference(fonts.find_font()))


def test_without_a_font_for_it_a_character_reads_as_its_escape():
    dejavu = fonts.find_font()
    assert 0x4E2D not in fonts.coverage(dejavu)
    assert fonts.drawable("中 x", dejavu) == "\\u4e2d x"


@needs_cjk_font
@pytest.mark.browser
def test_exported_cjk_word_cloud_draws_the_glyph():
    """The cloud as `tokengrad export` writes it: the figure through kaleido + Chromium to PNG."""
    import io

    from PIL import Image

    from tokengrad.figures.export import figure_to_bytes, find_browser
    from tokengrad.figures.wordclouds import make_wordcloud_figure

    if find_browser() is None:
        pytest.skip("no Chrome/Chromium (apt-get install -y chromium)")
    fig = make_wordcloud_figure({"tokens": {"中": 3}})
    png = Image.open(io.BytesIO(figure_to_bytes(fig, "png", width=800, height=400))).convert("RGB")
    drawn, cjk = _ink(png), fonts.cloud_font(["中"])
    assert _iou(drawn, _reference(cjk)) > 0.6 > _iou(drawn, _reference(fonts.find_font()))
