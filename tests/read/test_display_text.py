"""Recorded text shown safely: bidi overrides, controls, terminal escapes and zero-width characters are
written as escapes in the dashboard's tokens, the word clouds, `tokengrad inspect` and the doctor's text;
ordinary non-ASCII text is left alone."""

import pandas as pd
import pytest
from test_queries import make_tiny_run

from tokengrad.doctor.finding import Finding, TokenEvidence
from tokengrad.doctor.report import as_html, as_text
from tokengrad.figures.tokens import display_token, make_token_figure, token_html
from tokengrad.figures.wordclouds import clean_token, prepare_frequencies, wordcloud_png
from tokengrad.read.display import slug, visible_lines, visible_text
from tokengrad.read.runs import load_run

# payload -> how it must read: each hidden character as the escape Python would write for it
PAYLOADS = {
    "abc\u202edef": "abc\\u202edef",  # RIGHT-TO-LEFT OVERRIDE: would show 'abcfed'
    "x\u200fy": "x\\u200fy",  # RIGHT-TO-LEFT MARK
    "\u2066lri\u2069": "\\u2066lri\\u2069",  # LEFT-TO-RIGHT ISOLATE ... POP DIRECTIONAL ISOLATE
    "\x1b[31mred\x1b[0m": "\\x1b[31mred\\x1b[0m",  # ANSI colour: would recolour the terminal
    "bell\x07": "bell\\x07",  # C0
    "nel\x85csi\x9b": "nel\\x85csi\\x9b",  # C1 (NEXT LINE, CONTROL SEQUENCE INTRODUCER)
    "zero\u200bwidth\ufeff": "zero\\u200bwidth\\ufeff",  # ZERO WIDTH SPACE, BOM
    "line\u2028sep": "line\\u2028sep",
    "nul\x00": "nul\\x00",
    "a\nb\tc\rd": "a\\nb\\tc\\rd",
    "private\ue000": "private\\ue000",
    "astral\U000e0001": "astral\\U000e0001",  # LANGUAGE TAG (Cf, beyond the BMP)
}
ORDINARY = [
    "café",
    "naïve",
    "日本語のテキスト",
    "مرحبا",
    "שלום",
    "😀",
    "👩\u200d💻",
    "👨🏽\u200d🚀",
    "a\\x1b",
    " ",
]


@pytest.mark.parametrize("raw, shown", PAYLOADS.items())
def test_hidden_characters_read_as_escapes(raw, shown):
    assert visible_text(raw) == shown


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_unchanged(text):
    assert visible_text(text) == text
    assert display_token(text) == text and clean_token("Ġ" + text + " ") == text.strip() or text == " "


def test_keep_and_symbols():
    assert visible_lines("one\ntwo\tthree\u202e") == "one\ntwo\tthree\\u202e"
    assert visible_text("a\nb\x1b", symbols={"\n": "↵"}) == "a↵b\\x1b"
    assert visible_text(None) == "" and visible_text(3) == "3"
    # a joiner outside an emoji sequence is a hidden character like any other
    assert visible_text("a\u200db") == "a\\u200db" and visible_text("\u200d😀") == "\\u200d😀"


def test_dashboard_tokens_show_escapes():
    tokens = pd.DataFrame(
        {
            "position": [0, 1, 2, 3],
            "token": ["abc\u202edef", "\x1b[2J", "x\u200by", "ok\n"],
            "prob": [0.1, 0.5, 0.9, 0.3],
        }
    )
    assert [display_token(t) for t in tokens["token"]] == ["abc\\u202edef", "\\x1b[2J", "x\\u200by", "ok↵"]
    html = token_html(tokens, "prob")
    for raw in ("\u202e", "\x1b", "\u200b"):
        assert raw not in html
    assert "abc\\u202edef" in html and "\\x1b[2J" in html and "token &#x27;x\\u200by&#x27;" in html
    fig = make_token_figure(tokens, "prob")
    assert "\u202e" not in fig.to_json() and "abc\\\\u202edef" in fig.to_json()


def test_word_cloud_draws_a_token_holding_a_line_break_and_controls():
    assert clean_token("a\nb") == "a↵b" and clean_token("Ġx\ty") == "x⇥y"
    assert clean_token("\u202eevil") == "\\u202eevil" and clean_token("\x1b[31m") == "\\x1b[31m"
    freqs = prepare_frequencies(
        pd.DataFrame({"token": ["b", "c", "a\nb", "x\u202ey", "café"], "count": [12, 12, 12, 3, 2]})
    )
    assert freqs == {"a↵b": 12.0, "b": 12.0, "c": 12.0, "x\\u202ey": 3.0, "café": 2.0}
    assert wordcloud_png(freqs, width=200, height=120)[:8] == b"\x89PNG\r\n\x1a\n"
    # frequencies that skipped prepare_frequencies are made drawable too
    assert wordcloud_png({"a\nb": 1.0, "\r\n": 2.0}, width=200, height=120)[:4] == b"\x89PNG"


def test_inspect_prints_terminal_escapes_in_a_folder_name_as_text(tmp_path, capsys):
    from tokengrad.cli.inspect import cli_inspect

    run_dir = make_tiny_run(tmp_path / "r\x1b[31mRED\u202eabc", name="n\x1b]0;title\x07")
    assert cli_inspect([str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert "r\\x1b[31mRED\\u202eabc" in out and "n\\x1b]0;title\\x07" in out
    assert load_run(run_dir).meta_name == "n\x1b]0;title\x07"  # the data itself is untouched


def test_cli_errors_print_paths_escaped(tmp_path, capsys):
    from tokengrad.cli import main

    assert main(["inspect", str(tmp_path / "gone\x1b[2J")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "gone\\x1b[2J" in err


def test_doctor_text_and_html_show_evidence_escaped():
    f = Finding(
        id="rel4_payload",
        severity="warning",
        confidence=0.5,
        first_step=3,
        last_step=3,
        message="loop quoted: 'ab\u202ecd'\nsecond line \x1b[31m",
        tokens=(TokenEvidence(step=3, sample_id=1, position=2, text="\x1b[2J\u200f日本", share=0.5),),
        run="run\x1b[1m",
    )
    text = as_text([f])
    assert "\x1b" not in text and "\u202e" not in text and "\u200f" not in text
    assert "'\\x1b[2J\\u200f日本'" in text and "ab\\u202ecd" in text and "run\\x1b[1m" in text
    assert "ab\\u202ecd'\nsecond line \\x1b[31m" in text  # the message keeps its own line break
    html = as_html([f], ["r"])
    assert "\u202e" not in html and "\x1b" not in html and "\\u200f日本" in html


def test_slug_is_the_one_file_stem_rule():
    # the dashboard's download names and the exported figure set's file names (keep=".")
    assert slug("entropy law / run 1.5", "figure") == "entropy_law_run_1_5"
    assert slug("entropy law / run 1.5", "run", keep=".") == "entropy_law_run_1.5"
    assert slug("__é/ü__", "figure") == "figure" and slug("", "run", keep=".") == "run"
