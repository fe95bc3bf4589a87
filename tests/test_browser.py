"""End-to-end: `tokengrad dashboard` served on localhost, every page opened in headless Chromium.

Needs Debian's /usr/bin/chromium (never a downloaded browser) and Playwright's Python package; skipped
otherwise. Screenshots land in artifacts/dashboard/ (gitignored) for a look by eye.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest
from synthetic_runs import write_synthetic_run

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "artifacts" / "dashboard"
PAGES = {"overview": "", "buckets": "buckets", "wordclouds": "wordclouds", "inspector": "inspector",
         "evaluation": "evaluation"}
# Charts each page shows on the synthetic runs (at least): overview 4, buckets 7, clouds 1, inspector 1,
# eval 2.
MIN_CHARTS = {"overview": 4, "buckets": 7, "wordclouds": 1, "inspector": 1, "evaluation": 2}
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"dashboard not healthy at {url} after {timeout} s")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    write_synthetic_run(root / "grpo", n_steps=40, n_samples=8, n_tok=24, seed=0)
    write_synthetic_run(root / "tr_grpo", n_steps=40, n_samples=8, n_tok=24, seed=1)
    write_synthetic_run(root / "live", n_steps=LIVE_STEPS, n_samples=2, n_tok=8, seed=2)
    port = _free_port()
    cmd = [
        sys.executable,
        "-c",
        "import sys; from tokengrad.cli import main; sys.exit(main())",
        "dashboard",
        str(root),
        "--port",
        str(port),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # Own process group: the CLI starts streamlit as a child; stopping the group stops both.
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc)
        yield Server(url, root)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            b.close()


def _settle(page, min_charts: int, timeout_ms: int = 60_000) -> None:
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


@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_without_errors(server, browser, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server.url}/{PAGES[name]}")
        _settle(page, MIN_CHARTS[name])
        _screenshot(page, ARTIFACTS / f"{name}.png")
        assert page.locator("[data-testid=stException]").count() == 0
        assert "Traceback" not in page.inner_text("body")
        n_charts = page.locator("[data-testid=stPlotlyChart]").count()
        assert n_charts >= MIN_CHARTS[name], f"{name}: {n_charts} charts"
        # The sidebar offers both runs, and the run picker has them picked.
        assert "grpo" in page.inner_text("[data-testid=stSidebar]")
        if name == "inspector":  # the coloured completion, one span per token (24 per synthetic completion)
            assert page.locator(".tg-tokens .tg-tok").count() == 24
    finally:
        page.close()


def test_live_refresh_shows_steps_written_after_the_page_opened(server, browser):
    """A run still being written: with Live refresh on, a new step file appears without a reload."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from tokengrad import schema

    run = server.root / "live"
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server.url}/buckets")
        page.locator("[data-testid=stSelectbox]").first.wait_for(timeout=60_000)
        _pick_run(page, "live")
        page.wait_for_function(f"{TICK_MAX_JS} == '{LIVE_STEPS - 1}'", timeout=60_000)
        page.get_by_text("Live refresh").click()
        page.wait_for_selector("text=checked", timeout=30_000)
        steps = pq.read_table(run / "steps" / "rank000" / schema.file_name(0, LIVE_STEPS - 1)).slice(0, 1)
        steps = steps.set_column(0, "step", pc.cast(pc.add(steps.column("step"), LIVE_STEPS), "int32"))
        pq.write_table(steps, run / "steps" / "rank000" / schema.file_name(LIVE_STEPS, LIVE_STEPS))
        page.wait_for_function(f"{TICK_MAX_JS} == '{LIVE_STEPS}'", timeout=30_000)  # polled every 5 s
        _screenshot(page, ARTIFACTS / "live_refresh.png")
    finally:
        page.close()


@pytest.mark.parametrize("fmt, magic", [("png", b"\x89PNG"), ("svg", b"<svg"), ("html", b"<html")])
def test_chart_download_button_serves_the_figure(server, browser, fmt, magic):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(f"{server.url}/evaluation")
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


def _pick_run(page, name: str) -> None:
    """Choose `name` in the page's Run selectbox."""
    page.locator("[data-testid=stSelectbox]").filter(has_text="Run").first.click()
    page.get_by_role("option", name=name, exact=True).click()
    page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=60_000)


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
