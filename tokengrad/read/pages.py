"""The dashboard's pages by id: the one list every link to a page is made from. The app builds its sidebar
from it (app/pages.py adds each page's title and icon; its view is app/views/<id>.py), the doctor's
findings name their page by id (tokengrad.doctor.links turns it into a URL), and in-app links carry the
id's URL path with URL state (tokengrad.app.views.urlstate) in the query. Here, below both, because the doctor
may not import the app.

    page_url(INSPECTOR, {"runs": "lab_grpo", "step": "97"})    # 'inspector?runs=lab_grpo&step=97'
    url_path(OVERVIEW)                                         # '': the first page is served at the root
"""

from __future__ import annotations

from urllib.parse import urlencode

# In sidebar order. Streamlit serves a page at its file's stem, and the first page at the root.
PAGE_IDS = ("overview", "buckets", "wordclouds", "inspector", "entropy", "rollout", "whatif", "evaluation")
OVERVIEW, BUCKETS, WORDCLOUDS, INSPECTOR, ENTROPY, ROLLOUT, WHATIF, EVALUATION = PAGE_IDS
HOME = PAGE_IDS[0]


def check_page(page: str) -> str:
    """`page` if it is a page id, else a ValueError naming the known ones."""
    if page not in PAGE_IDS:
        raise ValueError(f"unknown dashboard page {page!r}; pages: {', '.join(PAGE_IDS)}")
    return page


def url_path(page: str) -> str:
    """The page's URL path below the server's address: '' for the first page, else its id."""
    return "" if check_page(page) == HOME else page


def page_url(page: str, query: dict[str, str] | None = None) -> str:
    """A link to the page relative to the server's root, with `query` (URL state) when given."""
    return url_path(page) + (f"?{urlencode(query)}" if query else "")
