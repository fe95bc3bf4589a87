"""Where a finding shows in the dashboard: its page (an id of tokengrad.read.pages) and the URL query the
app restores (app.views.urlstate: runs, step, sample). `runs` is the run's folder name (Run.name), so a
link to a copied run folder opens the copy; `sample` is the first listed token's, which for a spike is the
sample its headline names (doctor.culprits.lead_first).

    dashboard_query(finding)     # {"runs": "lab_grpo", "step": "97", "sample": "36"}
    dashboard_url(finding)       # "http://127.0.0.1:8501/inspector?runs=lab_grpo&step=97&sample=36"
"""

from __future__ import annotations

from urllib.parse import urlencode

from tokengrad.doctor.finding import Finding
from tokengrad.read.pages import HOME, PAGE_IDS, url_path

DEFAULT_BASE = "http://127.0.0.1:8501"


def dashboard_query(finding: Finding) -> dict[str, str]:
    """The query parameters that open the finding's run, step and first sample."""
    query = {"runs": finding.run} if finding.run else {}
    step = next((t.step for t in finding.tokens), finding.first_step)
    if step is not None:
        query["step"] = str(int(step))
    sample = next((t.sample_id for t in finding.tokens if t.sample_id is not None), None)
    if sample is not None:
        query["sample"] = str(int(sample))
    return query


def dashboard_url(finding: Finding, base: str = DEFAULT_BASE) -> str:
    """The finding's page (tokengrad.read.pages; the Overview for a page id it does not know) at `base`,
    with dashboard_query."""
    page = finding.page if finding.page in PAGE_IDS else HOME
    return f"{base.rstrip('/')}/{url_path(page)}?{urlencode(dashboard_query(finding))}"
