"""The dashboard serving a runs root in a bucket (moto's S3-compatible server on 127.0.0.1) in Chromium: the
runs under the prefix are listed and drawn, and a run uploaded while the page is open appears."""

from __future__ import annotations

import importlib.util
import os
import time

import pyarrow.fs as pafs
import pytest
from synthetic_runs import write_synthetic_run
from test_browser import BAD_TEXT, CHROMIUM, LAUNCH_ARGS, PAGE_TEXT_JS, REPO, _settle

from tokengrad.cli.dashboard import serving
from tokengrad.read.remote import filesystem, parse_url

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"{CHROMIUM} is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed"),
]


def upload(local, url: str) -> None:
    u = parse_url(url)
    pafs.copy_files(str(local), u.path, destination_filesystem=filesystem(u))


def test_the_dashboard_serves_every_run_under_a_bucket_prefix(bucket, tmp_path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    root = f"{bucket}/runs"
    for name, seed in (("syn_a", 0), ("syn_b", 1)):
        write_synthetic_run(tmp_path / "local" / name, n_steps=20, n_samples=4, n_tok=16, seed=seed)
        upload(tmp_path / "local" / name, f"{root}/sweep/{name}")
    with serving(root, cwd=REPO) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{url}/?runs=sweep/syn_a,sweep/syn_b")
        _settle(page, min_charts=4)
        text = page.evaluate(PAGE_TEXT_JS)
        assert "syn_a" in text and "syn_b" in text
        assert not [bad for bad in BAD_TEXT if bad in text]
        write_synthetic_run(tmp_path / "local" / "late", n_steps=5, n_samples=2, n_tok=8, seed=2)
        upload(tmp_path / "local" / "late", f"{root}/late")
        deadline = time.monotonic() + 180  # the copy is refreshed in the background every 5 s
        while True:
            page.goto(f"{url}/?runs=late")
            try:
                _settle(page, min_charts=4, timeout_ms=15_000)
                break
            except PlaywrightTimeout:
                assert time.monotonic() < deadline, "the run uploaded while the page was open never appeared"
        text = page.evaluate(PAGE_TEXT_JS)
        assert "late" in text and "syn_a" not in text
        browser.close()
