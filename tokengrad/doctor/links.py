"""Where a finding shows in the dashboard: the page and the URL query the app restores
(app/views/urlstate.py: runs, step, sample). `runs` is the run's folder name (Run.name), so a link to a
copied run folder opens the copy; `sample` is the first listed token's, which for a spike is the sample
its headline names (doctor.culprits.lead_first).

    dashboard_query(finding)     # {"runs": "lab_grpo", "step": "97", "sample": "36"}
    dashboard_url(finding)       # "http://127.0.0.1:8501/inspector?runs=lab_grpo&step=97&sample=36"
"""

from __future__ import annotations

from urllib.parse import urlencode

from tokengrad.doctor.finding import Finding

DEFAULT_BASE = "http://127.0.0.1:8501"
# page name of a detector -> the Streamlit page's URL path (app/streamlit_app.py PAGES: the file's stem;
# the first page, Overview, is the root)
PAGE_PATHS = {"overview": "", "buckets": "buckets", "inspector": "inspector", "evaluation": "evaluation"}


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
    path = PAGE_PATHS.get(finding.page, "")
    return f"{base.rstrip('/')}/{path}?{urlencode(dashboard_query(finding))}"
