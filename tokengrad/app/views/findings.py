"""The doctor's findings at the top of the landing page: counts, then the ranked findings, each with a
button that opens the page, step and sample that show its evidence, then the detectors that could not run
on a run and why (a missing setting or column), so an unchecked run does not look healthy.

    from tokengrad.app.views import findings
    findings.render(runs)            # one call, self-contained (cached per run signature)

A finding's link is the same query string `tokengrad doctor` prints (tokengrad.doctor.links): `runs`, `step`
and `sample` are URL state (views/urlstate.py), so a printed link opens the same view in a fresh tab.
"""

from __future__ import annotations

import streamlit as st

from tokengrad.app import data
from tokengrad.app.pages import PAGES, view_file
from tokengrad.app.views import common
from tokengrad.app.views.sidebar import run_title
from tokengrad.doctor.engine import examine
from tokengrad.doctor.finding import share_note
from tokengrad.doctor.links import dashboard_query
from tokengrad.doctor.ranking import rank_key
from tokengrad.doctor.view import RunView
from tokengrad.read.display import visible_lines
from tokengrad.read.pages import HOME

BADGE = {"critical": ":red-badge[critical]", "warning": ":orange-badge[warning]", "info": ":blue-badge[info]"}
SHOWN = 5  # findings listed before the "more" expander


@st.cache_data(show_spinner=False, max_entries=64)
def _diagnose(run_dir: str, sig: data.Signature) -> tuple[list[dict], list[dict]]:
    result = examine(RunView(data.open_run(run_dir)))  # the small tables the pages read, from the cache
    found = [{**f.as_dict(), "query": dashboard_query(f), "run_dir": run_dir} for f in result.findings]
    return found, [n.as_dict() for n in result.not_checked]


def findings_for(run_dir: str) -> list[dict]:
    """The run's findings as dicts (Finding.as_dict plus the dashboard query), cached on its files. The run
    is named as the dashboard names it, by its folder (meta.json's name beside it where that differs), and
    the query opens that folder."""
    title, label = run_title(run_dir), common.run_name(run_dir)
    found = _diagnose(run_dir, data.signature(run_dir))[0]
    return [{**f, "run": title, "query": {**f["query"], "runs": label}} for f in found]


def not_checked_for(run_dir: str) -> list[dict]:
    """The detectors that could not run on the run: [{"detector", "run", "reason"}], cached likewise."""
    return _diagnose(run_dir, data.signature(run_dir))[1]


def open_finding(f: dict) -> None:
    """Put the finding's run, step and sample into Session State, then switch to its page (the Overview
    for a page id tokengrad/app/pages.py does not know)."""
    q = f["query"]
    if "step" in q:
        st.session_state["in_step"] = int(q["step"])
    if "sample" in q:
        st.session_state["in_sample"] = int(q["sample"])
    st.session_state["in_run"] = f["run_dir"]
    st.switch_page(view_file(f["page"] if f["page"] in PAGES else HOME), query_params=q)


def _steps(f: dict) -> str:
    if f["first_step"] is None:
        return "whole run"
    same = f["first_step"] == f["last_step"]
    return f"step {f['first_step']}" if same else f"steps {f['first_step']}-{f['last_step']}"


def _one(f: dict, key: str) -> None:
    with st.container(border=True):
        c1, c2 = st.columns([6, 1])
        head = f"{BADGE[f['severity']]} **{f['id']}** · {f['run']} · {_steps(f)}"
        c1.markdown(f"{head} · confidence {f['confidence']:.2f}")
        c1.text(visible_lines(f["message"]))
        note = share_note(f["tokens"])  # what each share is, as it was computed (the report says the same)
        if note:
            c1.caption(note)
        if f["tokens"] and c2.button("open", key=key, help="the page, step and sample that show it"):
            open_finding(f)


def _not_checked(skipped: list[dict]) -> None:
    with st.expander(f"{len(skipped)} detector(s) not checked: the run lacks what they read"):
        for n in skipped:
            st.markdown(f"**{n['detector']}** · {n['run']}: not checked, {n['reason']}")


def render(runs: list[str]) -> None:
    """The findings block: a count line, the ranked findings of the picked runs, the detectors not
    checked."""
    found: list[dict] = []
    skipped: list[dict] = []
    for run in runs:
        with common.guard(f"Findings of {common.run_name(run)}"):
            found += findings_for(run)
            skipped += not_checked_for(run)
    order = {"critical": 0, "warning": 1, "info": 2}
    found.sort(key=rank_key)  # the CLI's order: machine findings last (tokengrad.doctor.ranking)
    counts = {s: sum(f["severity"] == s for f in found) for s in order}
    st.subheader("Findings")
    st.caption(
        ", ".join(f"{n} {s}" for s, n in counts.items())
        + (f", {len(skipped)} not checked" if skipped else "")
        + " · `tokengrad doctor RUN` prints the same list with its evidence"
    )
    for i, f in enumerate(found[:SHOWN]):
        _one(f, f"fd_open_{i}")
    if len(found) > SHOWN:
        with st.expander(f"{len(found) - SHOWN} more"):
            for i, f in enumerate(found[SHOWN:], SHOWN):
                _one(f, f"fd_open_{i}")
    if skipped:
        _not_checked(skipped)
