"""One page registry: the dashboard's page ids (tokengrad.read.pages), their titles and views
(tokengrad/app/pages.py), the doctor's links and the in-app links all name a page the same way."""

from pathlib import Path

import pytest

from tokengrad.app.pages import PAGES, view_file, view_path
from tokengrad.doctor.engine import load_detectors
from tokengrad.doctor.finding import Finding, TokenEvidence
from tokengrad.doctor.links import dashboard_url
from tokengrad.doctor.registry import DETECTORS
from tokengrad.read.pages import HOME, INSPECTOR, PAGE_IDS, check_page, page_url, url_path

APP = Path(__file__).resolve().parents[2] / "tokengrad" / "app"


def test_every_page_has_a_title_and_a_view_in_the_sidebar_order():
    assert tuple(PAGES) == PAGE_IDS
    assert PAGES[INSPECTOR].title == "Token inspector" and view_file(INSPECTOR) == "views/inspector.py"
    for page in PAGE_IDS:
        assert view_path(page) == APP / "views" / f"{page}.py" and view_path(page).is_file()


def test_url_paths_are_the_view_stems_and_the_first_page_is_the_root():
    assert HOME == "overview" and url_path(HOME) == ""
    assert [url_path(p) for p in PAGE_IDS[1:]] == list(PAGE_IDS[1:])
    assert page_url(INSPECTOR, {"runs": "a b", "step": "3"}) == "inspector?runs=a+b&step=3"
    assert page_url("buckets") == "buckets"
    with pytest.raises(ValueError, match="unknown dashboard page 'inspektor'; pages: overview, buckets"):
        check_page("inspektor")


def test_every_detector_links_to_a_known_page():
    load_detectors()
    pages = {name: entry.page for name, entry in DETECTORS.items()}
    assert pages and not {n: p for n, p in pages.items() if p not in PAGE_IDS}
    assert (
        Finding(id="x", severity="info", confidence=1.0, first_step=None, last_step=None, message="m").page
        in PAGE_IDS
    )


def test_dashboard_url_names_the_page_by_its_registered_path():
    spike = Finding(
        id="s",
        severity="warning",
        confidence=1.0,
        first_step=97,
        last_step=97,
        message="m",
        tokens=(TokenEvidence(97, 36),),
        run="lab",
        page=INSPECTOR,
    )
    assert dashboard_url(spike) == "http://127.0.0.1:8501/inspector?runs=lab&step=97&sample=36"
    whole = Finding(
        id="w", severity="info", confidence=1.0, first_step=None, last_step=None, message="m", run="lab"
    )
    assert dashboard_url(whole, base="http://h:1/") == "http://h:1/?runs=lab"
    unknown = Finding(
        id="u",
        severity="info",
        confidence=1.0,
        first_step=2,
        last_step=2,
        message="m",
        run="lab",
        page="nowhere",
    )  # the Overview, as before
    assert dashboard_url(unknown) == "http://127.0.0.1:8501/?runs=lab&step=2"
