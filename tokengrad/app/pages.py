"""The dashboard's page registry: each page of tokengrad.read.pages with its title, icon and view module.
The router (streamlit_app.py) builds the sidebar from it, the findings' **open** buttons and in-app
links switch to its pages, and the doctor's printed links (tokengrad.doctor.links) name the same ids.

    PAGES["inspector"].title       # 'Token inspector'
    view_file("inspector")         # 'views/inspector.py': st.switch_page's path, relative to the router
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from tokengrad.read.pages import (
    BUCKETS,
    ENTROPY,
    EVALUATION,
    INSPECTOR,
    OVERVIEW,
    ROLLOUT,
    WHATIF,
    WORDCLOUDS,
    check_page,
)

APP_DIR = Path(__file__).resolve().parent


class Page(NamedTuple):
    title: str
    icon: str  # a Material Symbols name (":material/NAME:"), served with Streamlit's own files


PAGES: dict[str, Page] = {  # in tokengrad.read.pages.PAGE_IDS' order (the sidebar's)
    OVERVIEW: Page("Overview", ":material/monitoring:"),
    BUCKETS: Page("Probability buckets", ":material/bar_chart:"),
    WORDCLOUDS: Page("Word clouds", ":material/cloud:"),
    INSPECTOR: Page("Token inspector", ":material/text_fields:"),
    ENTROPY: Page("Entropy", ":material/water_drop:"),
    ROLLOUT: Page("Rollout vs trainer", ":material/compare_arrows:"),
    WHATIF: Page("What if", ":material/alt_route:"),
    EVALUATION: Page("Evaluation", ":material/checklist:"),
}


def view_file(page: str) -> str:
    """The page's view module, relative to the router's folder (Streamlit serves it at the file's stem,
    which is the page id)."""
    return f"views/{check_page(page)}.py"


def view_path(page: str) -> Path:
    return APP_DIR / view_file(page)
