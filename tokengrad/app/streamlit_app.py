"""Dashboard entrypoint: the shared sidebar and the page router, nothing else.

tokengrad dashboard runs/                                   # preferred
streamlit run tokengrad/app/streamlit_app.py -- --root runs/          # the same, by hand
"""

from __future__ import annotations

import sys
from pathlib import Path

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
if (
    _PACKAGE_PARENT not in sys.path
):  # `streamlit run` puts only tokengrad/app/ on sys.path; `tokengrad.*` needs its parent
    sys.path.insert(0, _PACKAGE_PARENT)

import streamlit as st  # noqa: E402

from tokengrad.app import data  # noqa: E402
from tokengrad.app.pages import PAGES, view_path  # noqa: E402
from tokengrad.app.views import sidebar, welcome  # noqa: E402

# A file, not a ":material/...:" name: Streamlit's browser code fetches a material favicon from a public
# font host, and a local dashboard must not reach the internet. An SVG file becomes a data: URL.
ICON = Path(__file__).resolve().parent / "assets" / "icon.svg"


def run() -> None:
    st.set_page_config(page_title="tokengrad", page_icon=ICON, layout="wide")
    sidebar.render()
    welcome.render()
    page = st.navigation([st.Page(view_path(p), title=v.title, icon=v.icon) for p, v in PAGES.items()])
    try:
        page.run()
    finally:  # also after st.stop / st.rerun, which unwind through here
        data.release_freed_memory()


run()
