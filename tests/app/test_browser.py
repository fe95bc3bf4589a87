"""End-to-end: `tokengrad dashboard` served on localhost, every page opened in headless Chromium.

Every page is loaded on the shipped sample runs, on a run where every step is dead (all advantages 0), on
a Lopti run (two updates per step) and on two ordinary synthetic runs, picked through the URL's query
string; no page may show "NaN", a traceback or a section that "could not be drawn". `tokengrad export`
of the same runs must not write a NaN label. Needs Debian's /usr/bin/chromium (never a downloaded
browser) and Playwright's Python package; skipped otherwise. Screenshots land in artifacts/dashboard/
(gitignored) for a look by eye.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from typing import NamedTuple

import pytest
from synthetic_runs import write_synthetic_run

from tokengrad.cli.dashboard import serving

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts" / "dashboard"
PAGES = {
    "overview": "",
    "buckets": "buckets",
    "wordclouds": "wordclouds",
    "inspector": "inspector",
    "evaluation": "evaluation",
}
# Charts each page shows on the synthetic runs (at least): overview 4, buckets 8, clouds 1, inspector 1,
# eval 2.
MIN_CHARTS = {"overview": 4, "buckets": 8, "wordclouds": 1, "inspector": 1, "evaluation": 2}
SAMPLE_RUNS = REPO / "sample_runs"
SHIPPED = sorted(p.name for p in SAMPLE_RUNS.glob("*") if (p / "meta.json").exists())
SCENARIOS = {  # name -> runs picked through the URL
    "shipped": SHIPPED,
    "dead": ["dead"],
    "lopti": ["lopti"],
    "synthetic": ["syn_grpo", "syn_tr_grpo"],
}
BAD_TEXT = ("NaN", "Traceback", "could not be drawn")
# Every text the page shows, including the charts' SVG labels (innerText leaves SVG text out).
PAGE_TEXT_JS = (
    "document.body.innerText + ' ' + Array.from(document.querySelectorAll('svg text'))"
    ".map(t => t.textContent).join(' ')"
)
LIVE_STEPS = 6
# The largest label on the page's first slider's tick bar (the last step of the run on the step-range slider).
TICK_MAX_JS = (
    "(document.querySelector('[data-testid=stMain] [data-testid=stSliderTickBar]')?.innerText || '')"
    ".trim().split(/\\s+/).pop()"
)
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed"),
]


class Server(NamedTuple):
    url: str
    root: Path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    for name in SHIPPED:
        shutil.copytree(SAMPLE_RUNS / name, root / name)
    write_synthetic_run(root / "syn_grpo", n_steps=40, n_samples=8, n_tok=24, seed=0, dead=0.25)
    write_synthetic_run(root / "syn_tr_grpo", n_steps=40, n_samples=8, n_tok=24, seed=1)
    write_synthetic_run(root / "dead", n_steps=20, n_samples=4, n_tok=16, seed=3, dead=1.0)
    write_synthetic_run(root / "lopti", n_steps=20, n_samples=4, n_tok=16, seed=4, lopti=True, dead=0.2)
    write_synthetic_run(root / "live", n_steps=LIVE_STEPS, n_samples=2, n_tok=8, seed=2)
    with serving(root, cwd=REPO) as url:
        yield Server(url, root)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


def _settle(page, min_charts: int, timeout_ms: int = 120_000) -> None:
    """Wait until the page drew its charts (also those in closed expanders) and the script stopped."""
    page.wait_for_selector("[data-testid=stPlotlyChart] .main-svg", state="attached", timeout=timeout_ms)
    page.wait_for_function(
        f"document.querySelectorAll('[data-testid=stPlotlyChart] .main-svg').length >= {min_charts}",
        timeout=timeout_ms,
    )
    page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=timeout_ms)
    page.wait_for_timeout(800)  # plotly finishes layout after the element appears


def _screenshot(page, path: Path) -> None:
    """The whole page: Streamlit scrolls inside its main container, so grow the viewport to fit it."""
    height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 40, 8000)})
    page.wait_for_timeout(800)
    page.screenshot(path=str(path))


def _open(browser, server, name: str, runs: list[str]):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{server.url}/{PAGES[name]}?runs={','.join(runs)}")
    return page


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_without_errors(server, browser, name, scenario):
    runs = SCENARIOS[scenario]
    if not runs:
        pytest.skip("sample_runs/ not generated yet")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = _open(browser, server, name, runs)
    try:
        _settle(page, MIN_CHARTS[name] if scenario == "synthetic" else 1)
        _screenshot(page, ARTIFACTS / f"{scenario}_{name}.png")
        assert page.locator("[data-testid=stException]").count() == 0
        text = page.evaluate(PAGE_TEXT_JS)
        for bad in BAD_TEXT:
            assert bad not in text, f"{scenario}/{name}: {bad!r} on the page"
        picked = page.locator("[data-testid=stSidebar] [data-tag]").all_inner_texts()
        assert sorted(picked) == sorted(runs)  # the runs came from the URL
        if scenario == "synthetic":
            n_charts = page.locator("[data-testid=stPlotlyChart]").count()
            assert n_charts >= MIN_CHARTS[name], f"{name}: {n_charts} charts"
        if name == "inspector" and scenario == "synthetic":  # one span per token (24 per completion)
            assert page.locator(".tg-tokens .tg-tok").count() == 24
        if name == "inspector" and scenario == "dead":
            assert "had no gradient" in text and "Steps with a gradient: none" in text
        if name == "overview" and scenario == "dead":
            assert "20 of 20 steps had no gradient" in text
    finally:
        page.close()


def test_run_chips_wear_the_run_colours(server, browser):
    from tokengrad.figures.style import run_colors

    runs = SCENARIOS["synthetic"]
    page = _open(browser, server, "evaluation", runs)
    try:
        _settle(page, 1)
        folder = sorted(p.name for p in server.root.iterdir() if (p / "meta.json").exists())
        colors = run_colors(folder)  # assigned over the whole folder: a run keeps it whatever is picked
        tags = page.locator("[data-testid=stSidebar] [data-tag]")
        for i in range(tags.count()):
            name = tags.nth(i).inner_text().strip()
            bg = tags.nth(i).evaluate("e => getComputedStyle(e).backgroundColor")
            r, g, b = (int(colors[name][k : k + 2], 16) for k in (1, 3, 5))
            assert bg.replace(" ", "") == f"rgb({r},{g},{b})", (name, bg)
    finally:
        page.close()


def test_export_of_the_scenario_runs_writes_no_nan_label(server, tmp_path, capsys):
    """`tokengrad export` of the shipped, the all-dead and the Lopti runs: SVG text never reads NaN, and
    every figure left out is named with a reason."""
    from tokengrad.cli.export import cli_export

    runs = [str(server.root / n) for n in [*SHIPPED, "dead", "lopti"]]
    out = tmp_path / "figs"
    assert cli_export([*runs, "--out", str(out), "--format", "svg", "--words", "40"]) == 0
    err = capsys.readouterr().err
    svgs = sorted(out.glob("*.svg"))
    names = {p.name for p in svgs}
    assert {"reward.svg", "entropy.svg", "grad_norm.svg", "gradient_share_lopti.svg"} <= names
    for p in svgs:
        text = p.read_text()
        assert ">NaN" not in text and "NaN%" not in text, p.name
    assert "skipped gradient_share_dead: none of the 20 steps had a gradient" in err
    assert "skipped bucket_shares_dead: all 10 analysed steps had no gradient" in err


def test_live_refresh_shows_steps_written_after_the_page_opened(server, browser):
    """A run still being written: with Live refresh on, a new step file appears without a reload."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tokengrad import schema

    run = server.root / "live"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server.url}/buckets?runs=live")
        page.wait_for_function(f"{TICK_MAX_JS} == '{LIVE_STEPS - 1}'", timeout=60_000)
        page.get_by_text("Live refresh").click(timeout=60_000)
        page.wait_for_selector("text=checked", timeout=60_000)
        steps = pq.read_table(run / "steps" / "rank000" / schema.file_name(0, LIVE_STEPS - 1)).slice(0, 1)
        steps = steps.set_column(0, "step", pc.cast(pc.add(steps.column("step"), LIVE_STEPS), "int32"))
        pq.write_table(steps, run / "steps" / "rank000" / schema.file_name(LIVE_STEPS, LIVE_STEPS))
        page.wait_for_function(f"{TICK_MAX_JS} == '{LIVE_STEPS}'", timeout=60_000)  # polled every 5 s
        # a run folder that appears while the page is open is listed and picked
        write_synthetic_run(server.root / "zz_new", n_steps=3, n_samples=2, n_tok=8, seed=5)
        page.wait_for_selector("[data-testid=stSidebar] [data-tag] >> text=zz_new", timeout=60_000)
        _screenshot(page, ARTIFACTS / "live_refresh.png")
    finally:
        page.close()
        shutil.rmtree(server.root / "zz_new", ignore_errors=True)


@pytest.mark.parametrize("fmt, magic", [("png", b"\x89PNG"), ("svg", b"<svg"), ("html", b"<html")])
def test_chart_download_button_serves_the_figure(server, browser, fmt, magic):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server.url}/evaluation?runs=syn_grpo,syn_tr_grpo")
        _settle(page, MIN_CHARTS["evaluation"])
        page.locator("[data-testid=stSidebar]").get_by_text(fmt, exact=True).click()
        page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=60_000)
        button = page.get_by_role("button", name=f"Download {fmt.upper()}").first
        with page.expect_download(timeout=60_000) as info:
            button.click()
        download = info.value
        assert download.suggested_filename == f"accuracy_by_difficulty.{fmt}"
        head = Path(download.path()).read_bytes()[:512]
        assert magic in head, head[:80]
    finally:
        page.close()


def test_chart_data_downloads_as_csv(server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server.url}/evaluation?runs=syn_grpo")
        _settle(page, MIN_CHARTS["evaluation"])
        with page.expect_download(timeout=60_000) as info:
            page.get_by_role("button", name="Download CSV").first.click()
        assert info.value.suggested_filename == "accuracy_by_difficulty.csv"
        lines = Path(info.value.path()).read_text().splitlines()
        assert lines[0] == "trace,panel,x,y" and lines[1].startswith("syn_grpo,x/y,3,")
    finally:
        page.close()


def test_server_binds_localhost_only(server):
    """The default bind address is 127.0.0.1: the listening socket is on loopback, no other interface."""
    psutil = pytest.importorskip("psutil")
    port = int(server.url.rsplit(":", 1)[1])
    listening = [
        c.laddr.ip
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
    assert listening and set(listening) <= {"127.0.0.1"}, listening


# Every chart of a page: its text inside the chart, a legend of bounded height, distinct tick labels.
CHART_CHECK_JS = """() => Array.from(document.querySelectorAll('[data-testid=stPlotlyChart] .js-plotly-plot'))
  .map(plot => {
    const box = plot.getBoundingClientRect();
    const outside = Array.from(plot.querySelectorAll('svg text')).filter(t => t.textContent.trim())
      .filter(t => { const b = t.getBoundingClientRect();
        return b.width > 0 && (b.left < box.left - 1 || b.right > box.right + 1 || b.top < box.top - 1
                               || b.bottom > box.bottom + 1); })
      .map(t => t.textContent);
    const legend = plot.querySelector('g.legend'), area = plot.querySelector('.nsewdrag');
    const l = legend ? legend.getBoundingClientRect() : null, a = area ? area.getBoundingClientRect() : null;
    const side = !!(l && a && l.left >= a.right - 1);  // a legend beside the plot takes no plot height
    const axes = Array.from(plot.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above'))
      .map(a => Array.from(a.querySelectorAll('text')).map(t => t.textContent).filter(t => t.trim()));
    return {height: box.height, legend: l && !side ? l.height : 0, outside, axes};
  })"""


@pytest.mark.parametrize("name", ["overview", "buckets", "evaluation"])
def test_charts_keep_their_labels_inside_on_the_shipped_runs(server, browser, name):
    runs = [r for r in SHIPPED if r.startswith("lab_")]
    page = _open(browser, server, name, runs)
    try:
        _settle(page, 2)
        charts = page.evaluate(CHART_CHECK_JS)
        assert len(charts) >= 2
        for i, c in enumerate(charts):
            assert not c["outside"], f"{name} chart {i}: text outside the chart: {c['outside']}"
            assert c["legend"] <= 0.35 * c["height"], (
                f"{name} chart {i}: legend {c['legend']} of {c['height']}"
            )
            for ticks in c["axes"]:
                assert len(ticks) == len(set(ticks)), f"{name} chart {i}: repeated tick labels {ticks}"
        _screenshot(page, ARTIFACTS / f"figures_{name}.png")
    finally:
        page.close()


def _number(page) -> int:
    return int(page.get_by_test_id("stNumberInputField").input_value())


def test_inspector_steps_spikes_and_opens_a_clicked_token_row(server, browser):
    from tokengrad.read.queries import top_tokens
    from tokengrad.read.runs import load_run

    page = _open(browser, server, "inspector", ["lab_grpo"])
    try:
        _settle(page, 1)
        run = load_run(server.root / "lab_grpo")
        start = _number(page)
        gn = run.layers[run.layers["layer"] == "total"].groupby("step")["grad_norm"].max()
        assert start == int(gn.idxmax())  # opens at the largest-gradient step
        page.get_by_role("button", name="◀ previous spike").click()
        page.wait_for_function(
            f"document.querySelector('[data-testid=stNumberInputField]').value != '{start}'"
        )
        _settle(page, 1)
        spike = _number(page)
        assert spike < start and f"Gradient-norm spike {spike}" in page.inner_text("[data-testid=stMain]")
        box = page.get_by_test_id("stNumberInputField")
        box.fill("37")
        box.press("Enter")
        page.wait_for_function("document.querySelector('[data-testid=stNumberInputField]').value == '37'")
        _settle(page, 1)
        assert "Step 37" in page.inner_text("[data-testid=stMain]")
        top = top_tokens(run, 37, k=20)
        table = page.locator("[data-testid=stDataFrame]").nth(1)  # tokens carrying the step's gradient
        table.wait_for(state="visible")
        table.scroll_into_view_if_needed()
        grid = table.bounding_box()
        page.mouse.click(grid["x"] + 12, grid["y"] + 35 + 35 + 17)  # the second row's selection cell
        want = f"Sample {int(top['sample_id'].iloc[1])} ·"  # the second row: not the completion shown first
        page.wait_for_function(
            f"document.querySelector('[data-testid=stMain]').innerText.includes({want!r})", timeout=60_000
        )
        assert page.locator(".tg-tokens .tg-tok").count() > 0
        assert "pushed up" in page.inner_text("[data-testid=stMain]")
        _screenshot(page, ARTIFACTS / "inspector_clicked.png")
    finally:
        page.close()
