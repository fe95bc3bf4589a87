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
        make_tiny_run(root / "tr_grpo", name="tr_grpo"),  # a run is named by its folder
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
    files = sorted(p for p in tmp_path.iterdir() if p.name not in ("headline.csv", "captions.md"))
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
def test_the_command_offers_exactly_the_static_formats():
    """cli/export.py names the formats itself (its --help imports no plotly); they are the exporter's."""
    from tokengrad.cli.export import FORMATS

    assert FORMATS == export.STATIC_FORMATS


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
    assert names == {f"{n}.html" for n in EXPECTED} | {"plotly.min.js", "headline.csv", "captions.md"}
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


# In the browser: every text box of every exported figure inside the figure, legends of bounded height,
# and tick labels that read distinctly (no two alike on an axis, no SI prefixes), on the shipped runs.
FIGURE_CHECK_JS = """() => {
  const svg = document.querySelector('svg');
  const W = svg.width.baseVal.value, H = svg.height.baseVal.value;
  const out = {W, H, outside: [], legend: 0, axes: []};
  for (const t of svg.querySelectorAll('text')) {
    if (!t.textContent.trim()) continue;
    const b = t.getBBox(), m = t.getCTM();
    const x0 = m.a * b.x + m.c * b.y + m.e, y0 = m.b * b.x + m.d * b.y + m.f;
    const x1 = m.a * (b.x + b.width) + m.c * (b.y + b.height) + m.e;
    const y1 = m.b * (b.x + b.width) + m.d * (b.y + b.height) + m.f;
    const [l, r, u, d] = [Math.min(x0, x1), Math.max(x0, x1), Math.min(y0, y1), Math.max(y0, y1)];
    if (l < -1 || u < -1 || r > W + 1 || d > H + 1) out.outside.push(t.textContent);
  }
  const legend = svg.querySelector('g.legend');
  if (legend) out.legend = legend.getBBox().height;
  for (const layer of svg.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above')) {
    out.axes.push(Array.from(layer.querySelectorAll('text')).map(t => t.textContent));
  }
  return out;
}"""


@needs_browser
@pytest.mark.browser
@pytest.mark.parametrize("family", ["lab_", "lab_kk_", "smollm_"])
def test_exported_figures_keep_every_label_inside_and_readable(family, tmp_path):
    from pathlib import Path

    playwright = pytest.importorskip("playwright.sync_api")
    from tokengrad.figures.figureset import build_figure_set
    from tokengrad.read.runs import list_runs, load_run

    runs = {Path(p).name: load_run(p) for p in list_runs(Path(__file__).resolve().parents[2] / "sample_runs")}
    # one family (same model and task) per figure set, as the sample runs are compared
    # the three rules' runs of the family (lab_grpo_entropy / _rollout are single-run extras)
    rules = ("grpo", "tr_grpo", "ar_lopti")
    picked = {n: r for n, r in runs.items() if n.startswith(family) and n[len(family) :] in rules}
    assert len(picked) == 3, sorted(picked)
    specs, _, failed = build_figure_set(picked, max_words=30)
    assert failed == []
    specs = [s for s in specs if not s.name.startswith("wordcloud")]  # an image: no SVG text to measure
    paths = export.write_static(specs, tmp_path, "svg")
    problems = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_browser(), args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        for path in paths:
            page.goto(path.as_uri())
            got = page.evaluate(FIGURE_CHECK_JS)
            if got["outside"]:
                problems.append(f"{path.name}: text outside the figure: {got['outside']}")
            if got["legend"] > 0.3 * got["H"]:
                problems.append(f"{path.name}: legend {got['legend']:.0f} px of {got['H']:.0f}")
            for ticks in got["axes"]:
                labels = [t for t in ticks if t.strip()]
                if len(labels) != len(set(labels)):
                    problems.append(f"{path.name}: repeated tick labels {labels}")
                if [t for t in labels if t[-1:] in "µmkMG" and t[:-1].replace(".", "").isdigit()]:
                    problems.append(f"{path.name}: SI-prefixed ticks {labels}")
        browser.close()
    assert len(paths) >= 20 and not problems, "\n".join(problems)
