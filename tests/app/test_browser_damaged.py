"""Every page of the dashboard settles on every damaged run of tests/damaged_runs.py, in headless Chromium:
it says what it could not read (the loss line, on the landing page also as the doctor's finding) and its
script stops, within PAGE_TIMEOUT_MS of opening it (on a server that served each page once already, on the
undamaged run). The many-files damages have 5,000 files here, as
reported. The timeout is a hang guard; the timings: benchmarks/bench_damaged.py.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
from damaged_runs import BASE, DAMAGES, damaged_run

from tokengrad.cli.dashboard import serving

CHROMIUM = "/usr/bin/chromium"
PAGES = ("", "buckets", "wordclouds", "inspector", "entropy", "rollout", "evaluation")
# A hang guard (the damaged runs reported never settled, > 150 s): pages took 1.5-8.5 s on a 2-core machine
# at load 6, over 10 s at load 11; 30 s leaves room for a loaded machine.
PAGE_TIMEOUT_MS = 30_000
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-sync"]
LOSS_WORDS = r"/unreadable: |not read: |missing: /"  # every loss line holds one (tokengrad.read.unreadable)
SETTLED_JS = (
    "(() => { const m = document.querySelector('[data-testid=stMain]'); const t = m ? m.innerText : '';"
    f" return {LOSS_WORDS}.test(t) && !document.querySelector('[data-testid=stStatusWidget]'); }})()"
)
IDLE_JS = "!document.querySelector('[data-testid=stStatusWidget]')"
LOSSY = [d for d in DAMAGES if d != "steps_many_zero_rows"]  # zero-row files hold nothing: no loss

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    for damage in DAMAGES:
        damaged_run(root / damage, damage)
    shutil.copytree(BASE, root / "healthy")
    with serving(root) as url:
        yield url


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            for where in PAGES:  # the server's first script runs (imports, DuckDB) are not the damage's
                tab.goto(f"{server}/{where}?runs=healthy")
                tab.wait_for_selector("[data-testid=stMain] [data-testid=stHeading]", timeout=60_000)
                tab.wait_for_function(IDLE_JS, timeout=60_000)
            yield tab
        finally:
            browser.close()


@pytest.mark.parametrize("damage", LOSSY)
@pytest.mark.parametrize("where", PAGES, ids=lambda p: p or "overview")
def test_every_page_says_what_it_could_not_read(server, page, damage, where):
    page.goto(f"{server}/{where}?runs={damage}")
    page.wait_for_function(SETTLED_JS, timeout=PAGE_TIMEOUT_MS)
    text = page.evaluate("document.querySelector('[data-testid=stMain]').innerText")
    assert "Traceback" not in text and "could not be drawn" not in text
    if where == "":
        assert "critical" in text and ("unreadable_files" in text or "rank_missing" in text)


@pytest.mark.parametrize("where", PAGES, ids=lambda p: p or "overview")
def test_every_page_draws_on_five_thousand_zero_row_files(server, page, where):
    page.goto(f"{server}/{where}?runs=steps_many_zero_rows")
    page.wait_for_selector("[data-testid=stMain] [data-testid=stHeading]", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function(
        "!document.querySelector('[data-testid=stStatusWidget]') && "
        "document.querySelector('[data-testid=stMain] [data-testid=stPlotlyChart], "
        "[data-testid=stMain] [data-testid=stAlert]')",  # it draws, or says what it lacks
        timeout=PAGE_TIMEOUT_MS,
    )
    text = page.evaluate("document.querySelector('[data-testid=stMain]').innerText")
    assert "Traceback" not in text and "could not be drawn" not in text
