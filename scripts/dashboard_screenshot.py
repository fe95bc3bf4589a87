"""Screenshot of the dashboard for the README: `tokengrad dashboard sample_runs` served on 127.0.0.1,
one page opened in Debian's headless Chromium (Playwright drives it; never a downloaded browser).

    python scripts/dashboard_screenshot.py                                  # docs/figures/dashboard.png
    python scripts/dashboard_screenshot.py --page buckets --runs lab_grpo --out /tmp/buckets.png
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tokengrad.cli.dashboard import serving

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
PAGES = ("", "buckets", "wordclouds", "inspector", "evaluation")  # "" is the Overview


def shoot(url: str, page_name: str, runs: list[str], out: Path, width: int, height: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(f"{url}/{page_name}?runs={','.join(runs)}", timeout=180_000)
            page.wait_for_selector("[data-testid=stPlotlyChart] .main-svg", state="attached", timeout=180_000)
            page.wait_for_function("!document.querySelector('[data-testid=stStatusWidget]')", timeout=180_000)
            page.wait_for_timeout(1500)  # plotly finishes its layout after the element appears
            page.screenshot(path=str(out))
        finally:
            browser.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=str(REPO / "sample_runs"), help="runs folder to serve")
    p.add_argument("--page", default="", choices=PAGES, help="dashboard page ('' = Overview)")
    p.add_argument("--runs", default="lab_grpo,lab_tr_grpo,lab_ar_lopti", help="comma-separated run names")
    p.add_argument("--out", default=str(REPO / "docs" / "figures" / "dashboard.png"))
    p.add_argument("--size", default="1400x900", help="viewport WIDTHxHEIGHT in pixels")
    args = p.parse_args()
    if not os.access(CHROMIUM, os.X_OK):
        sys.exit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    width, height = (int(v) for v in args.size.split("x"))
    with serving(args.root, timeout=120, cwd=REPO) as url:
        shoot(url, args.page, args.runs.split(","), Path(args.out), width, height)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
