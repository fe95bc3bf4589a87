"""`tokengrad export`: static PNG/SVG/PDF through kaleido + Chromium, and the HTML fallback without one."""

import struct

import plotly.graph_objects as go
import pytest
from test_queries import make_tiny_run

from tokengrad.cli.export import cli_export
from tokengrad.figures import export
from tokengrad.figures.export import figure_to_bytes, find_browser

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "svg": b"<svg", "pdf": b"%PDF-"}
needs_browser = pytest.mark.skipif(
    find_browser() is None, reason="no Chrome/Chromium (apt-get install -y chromium)"
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    other = {"name": "grpo", "params": {}}
    return [
        make_tiny_run(root / "tr", name="tr_grpo"),
        make_tiny_run(root / "grpo", name="grpo", weighting=other),
    ]


EXPECTED = {
    "headline_update_share",
    "reward",
    "entropy",
    "grad_norm",
    "accuracy_by_difficulty",
    "weight_curves",
} | {
    f"{kind}_{run}"
    for kind in (
        "gradient_share",
        "bucket_shares",
        "bucket_update_share",
        "grad_vs_prob",
        "grad_norm_layers",
        "wordcloud",
    )
    for run in ("tr_grpo", "grpo")
}


@needs_browser
@pytest.mark.browser
def test_export_png_svg_pdf_with_one_browser(runs, tmp_path, capsys):
    argv = [str(runs[1]), "--out", str(tmp_path), "--format", "png", "svg", "pdf"]
    assert cli_export(argv) == 0
    files = sorted(p for p in tmp_path.iterdir() if p.name != "headline.csv")
    assert (tmp_path / "headline.csv").read_text().startswith("run,below,token_share,update_share")
    expected = {n for n in EXPECTED if not n.endswith("tr_grpo")} - {
        "weight_curves"
    }  # grpo has no w(p) curve
    assert {p.stem for p in files} == expected and len(files) == 3 * len(expected)
    for p in files:
        assert MAGIC[p.suffix[1:]] in p.read_bytes()[:200], p.name
    # PNG IHDR width/height: a 3.5 in column at 300 dpi is 336 px * 3.125 = 1050 px wide, 7 in = 2100 px
    w, h = struct.unpack(">II", (tmp_path / "reward.png").read_bytes()[16:24])
    assert (w, h) == (1050, round(round(3.5 * 0.68 * 96) * 3.125))
    assert struct.unpack(">I", (tmp_path / "wordcloud_grpo.png").read_bytes()[16:20])[0] == 2100
    # pHYs: 300 dpi = 11811 pixels per metre on both axes, unit 1 (metre)
    png = (tmp_path / "reward.png").read_bytes()
    at = png.index(b"pHYs")
    assert struct.unpack(">IIB", png[at + 4 : at + 13]) == (11811, 11811, 1)
    assert str(tmp_path / "reward.pdf") in capsys.readouterr().out


@needs_browser
@pytest.mark.browser
def test_figure_to_bytes_formats():
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 0]))
    assert figure_to_bytes(fig, "png", width=200, height=100)[:8] == MAGIC["png"]
    with pytest.raises(ValueError, match="known"):
        figure_to_bytes(fig, "eps")


def test_figure_to_bytes_html_needs_no_browser(monkeypatch):
    monkeypatch.setattr(export, "find_browser", lambda: None)
    html = figure_to_bytes(go.Figure(go.Bar(x=["a"], y=[1])), "html")
    assert html.lower().startswith(b"<!doctype html>") and b"Plotly.newPlot" in html
    with pytest.raises(export.BrowserNotFoundError, match="apt-get install -y chromium"):
        figure_to_bytes(go.Figure(), "png")


def test_no_browser_writes_html_and_says_how_to_install(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(export, "find_browser", lambda: None)
    assert cli_export([str(r) for r in runs] + ["--out", str(tmp_path), "--format", "pdf"]) == 1
    err = capsys.readouterr().err
    assert "apt-get install -y chromium" in err and "BROWSER_PATH" in err and "Writing HTML instead" in err
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {f"{n}.html" for n in EXPECTED} | {"plotly.min.js", "headline.csv"}
    html = (tmp_path / "reward.html").read_text()
    assert '"name":"tr_grpo"' in html and '"name":"grpo"' in html  # both runs overlaid
    assert (
        'src="plotly.min.js"' in (tmp_path / "reward.html").read_text()
    )  # offline: the bundle sits alongside


def test_find_browser_prefers_browser_path(monkeypatch, tmp_path):
    exe = tmp_path / "my-chrome"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setenv("BROWSER_PATH", str(exe))
    assert find_browser() == str(exe)


def test_bad_run_and_bad_arguments(tmp_path, capsys):
    assert cli_export([str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    assert "meta.json is missing" in capsys.readouterr().err
    assert cli_export(["x", "--out", "o", "--format", "eps"]) == 2


def test_figure_set_skips_nan_labels_with_a_reason(runs):
    from tokengrad.figures.figureset import nan_label

    assert nan_label(go.Figure(go.Bar(x=["a", "b"], y=[0.5, float("nan")], texttemplate="%{y:.0%}")))
    assert "nan" in nan_label(go.Figure(go.Bar(x=["nan"], y=[1.0])))
    assert nan_label(go.Figure(layout=dict(title="share nan%"))) is not None
    assert nan_label(go.Figure(go.Bar(x=["[0.00,0.25)"], y=[0.5], texttemplate="%{y:.0%}"))) is None
    assert nan_label(go.Figure(layout=dict(title="financial"))) is None  # a word containing 'nan'
