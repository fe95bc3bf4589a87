"""A local dashboard talks to nobody else: every request a page load of the dashboard on sample_runs/ makes
in headless Chromium goes to the server on 127.0.0.1 (or is a data:/blob: URL the page made itself).
Streamlit's browser code fetches a ":material/...:" page icon from a public font host, so the app's favicon
is a local file (tokengrad/app/assets/icon.svg).
Needs Debian's /usr/bin/chromium and Playwright; skipped otherwise."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tokengrad.cli.dashboard import serving

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
PAGES = ("", "buckets", "wordclouds", "inspector", "entropy", "rollout", "whatif", "evaluation")
LOCAL_HOSTS = {"127.0.0.1", "localhost"}

NO_CHROMIUM = not os.access(CHROMIUM, os.X_OK)
NO_PLAYWRIGHT = importlib.util.find_spec("playwright") is None


def foreign(urls: list[str]) -> list[str]:
    """The URLs that leave this machine: not data:/blob:/about:, and not to a loopback host."""
    out = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about"):
            continue
        if parts.hostname not in LOCAL_HOSTS:
            out.append(url)
    return out


def test_foreign_finds_requests_that_leave_the_machine():
    urls = [
        "http://127.0.0.1:8501/static/js/index.js",
        "data:image/svg+xml;base64,PHN2Zz4=",
        "https://fonts.gstatic.com/s/i/short-term/release/materialsymbolsrounded/monitoring/default/24px.svg",
        "http://localhost:8501/_stcore/health",
    ]
    assert foreign(urls) == [urls[2]]


@pytest.mark.browser
@pytest.mark.skipif(NO_CHROMIUM, reason=f"{CHROMIUM} is not installed")
@pytest.mark.skipif(NO_PLAYWRIGHT, reason="playwright is not installed")
def test_every_page_load_stays_on_localhost():
    from playwright.sync_api import sync_playwright

    urls: list[str] = []
    with serving(REPO / "sample_runs", cwd=REPO) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("request", lambda r: urls.append(r.url))
            page.on("websocket", lambda ws: urls.append(ws.url))
            for name in PAGES:
                page.goto(f"{url}/{name}", timeout=120_000)
                page.wait_for_selector("[data-testid=stSidebar] [data-tag]", timeout=120_000)  # a run chip
                page.wait_for_function(
                    "!document.querySelector('[data-testid=stStatusWidget]')", timeout=120_000
                )
                page.wait_for_timeout(1500)  # icons and fonts load after the first paint
        finally:
            browser.close()
    assert any(urlsplit(u).path.startswith("/static/") for u in urls), urls[:20]  # the recording works
    assert foreign(urls) == []
