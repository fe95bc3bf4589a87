"""Word clouds: which tokens the policy is sure of and which it hesitates on (TR-GRPO arXiv 2511.00066
Fig. 1)."""

from __future__ import annotations

import streamlit as st

from app import data
from app.views import common
from tokengrad.figures.wordclouds import make_high_low_wordcloud_figure, prepare_frequencies

ADV_SIGNS = {"all tokens": None, "positive advantage": 1, "negative advantage": -1}


def _filters_ui(run: str) -> dict:
    c1, c2, c3 = st.columns(3)
    low = c1.slider("Low probability: p <", 0.05, 0.95, 0.25, 0.05, key="wc_low")
    high = c2.slider("High probability: p ≥", 0.05, 0.95, 0.75, 0.05, key="wc_high")
    sign = c3.radio("Advantage", list(ADV_SIGNS), horizontal=True, key="wc_sign")
    c1, c2, c3 = st.columns([2, 1, 1])
    stops = c1.text_input("Stop tokens (comma separated, matched on raw or cleaned text)", "", key="wc_stops")
    words = c2.slider("Words per cloud", 20, 300, 120, 10, key="wc_words")
    whitespace = c3.toggle("Show whitespace tokens (␣ ↵)", value=False, key="wc_ws")
    return {
        "low": low,
        "high": high,
        "adv_sign": ADV_SIGNS[sign],
        "words": words,
        "whitespace": whitespace,
        "stops": tuple(t.strip() for t in stops.split(",") if t.strip()),
        "step_range": common.step_range_ui(run, "wc_steps"),
    }


def _clouds(run: str, f: dict) -> None:
    name = common.run_name(run)
    if f["low"] > f["high"]:
        st.warning("The low-probability threshold is above the high one; the two clouds overlap.")
    common_args = dict(step_range=f["step_range"], adv_sign=f["adv_sign"], limit=4 * f["words"])
    high = data.query(run, "token_frequencies", prob_lo=f["high"], prob_hi=1.0, **common_args)
    low = data.query(run, "token_frequencies", prob_lo=0.0, prob_hi=f["low"], **common_args)
    fig = make_high_low_wordcloud_figure(
        high,
        low,
        titles=(f"p ≥ {f['high']:g}", f"p < {f['low']:g}"),
        show_whitespace=f["whitespace"],
        stop_tokens=f["stops"],
        max_words=f["words"],
    )
    common.chart(fig, "wc_cloud", f"wordcloud_{name}")
    c1, c2 = st.columns(2)
    for col, freqs, label in ((c1, high, "high"), (c2, low, "low")):
        words = prepare_frequencies(
            freqs, show_whitespace=f["whitespace"], stop_tokens=f["stops"], max_words=f["words"]
        )
        col.dataframe(
            {"token": list(words), "count": [int(v) for v in words.values()]},
            hide_index=True,
            height=240,
            width="stretch",
            key=f"wc_table_{label}",
        )


def render() -> None:
    st.title("Word clouds")
    runs = common.require_runs()
    run = common.pick_token_run(runs, "wc_run")
    if run is not None:
        with common.guard("Word clouds"):
            _clouds(run, _filters_ui(run))
    common.show_run_warnings(runs)


render()
