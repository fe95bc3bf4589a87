"""Word clouds: which tokens the policy is sure of and which it hesitates on (TR-GRPO arXiv 2511.00066
Fig. 1)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common
from tokengrad.figures.wordclouds import make_high_low_wordcloud_figure, prepare_frequencies
from tokengrad.read import meta_file

ADV_SIGNS = {"all tokens": None, "positive advantage": 1, "negative advantage": -1}
SIZES = {"count": "token count", "grad_sum": "summed gradient (Σ logit_grad_norm)"}


def _filters_ui(run: str) -> dict:
    c1, c2, c3 = st.columns(3)
    low = c1.slider("Low probability: p <", 0.05, 0.95, 0.25, 0.05, key="wc_low")
    high = c2.slider("High probability: p ≥", 0.05, 0.95, 0.75, 0.05, key="wc_high")
    sign = c3.radio("Advantage", list(ADV_SIGNS), horizontal=True, key="wc_sign")
    c1, c2, c3, c4 = st.columns([2, 1, 1, 1])
    stops = c1.text_input("Stop tokens (comma separated, matched on raw or cleaned text)", "", key="wc_stops")
    words = c2.slider("Words per cloud", 20, 300, 120, 10, key="wc_words")
    size_by = c3.radio("Size by", list(SIZES), format_func=SIZES.get, key="wc_size")
    whitespace = c4.toggle("Show whitespace tokens (␣ ↵)", value=False, key="wc_ws")
    return {
        "size_by": size_by,
        "low": low,
        "high": high,
        "adv_sign": ADV_SIGNS[sign],
        "words": words,
        "whitespace": whitespace,
        "stops": tuple(t.strip() for t in stops.split(",") if t.strip()),
        "step_range": common.step_range_ui(run, "wc_steps"),
    }


def _totals(t: dict, label: str) -> str:
    share = f"{t['grad_sum'] / t['all_grad_sum']:.0%}" if t["all_grad_sum"] > 0 else "none"
    pct = f" ({t['count'] / t['all_count']:.0%} of the selected tokens)" if t["all_count"] else ""
    return f"**{label}**: {t['count']:,} tokens{pct}, {t['distinct']:,} distinct; {share} of the gradient"


def _clouds(run: str, f: dict) -> None:
    name = common.run_name(run)
    if f["low"] > f["high"]:
        st.warning("The low-probability threshold is above the high one; the two clouds overlap.")
    budget = meta_file.token_budget(data.meta(run))
    if budget:  # the kept rows over-represent the tokens with the largest update shares
        st.info(
            f"{name} kept at most {budget:,} token rows per step (whole completions and the tokens with "
            "the largest update shares): the clouds count the kept rows, not every token of the run."
        )
    sel = dict(step_range=f["step_range"], adv_sign=f["adv_sign"])
    ranges = {"high": (f["high"], 1.0, f"p ≥ {f['high']:g}"), "low": (0.0, f["low"], f"p < {f['low']:g}")}
    freqs = {
        k: data.query(
            run,
            "token_frequencies",
            prob_lo=lo,
            prob_hi=hi,
            limit=4 * f["words"],
            order_by=f["size_by"],
            **sel,
        )
        for k, (lo, hi, _) in ranges.items()
    }
    clean = dict(show_whitespace=f["whitespace"], stop_tokens=f["stops"], max_words=f["words"])
    titles = (ranges["high"][2], ranges["low"][2])
    fig = make_high_low_wordcloud_figure(
        freqs["high"], freqs["low"], titles=titles, size_by=f["size_by"], **clean
    )
    totals = {
        k: data.query(run, "token_totals", prob_lo=lo, prob_hi=hi, **sel) for k, (lo, hi, _) in ranges.items()
    }
    tables = {k: _table(freqs[k], clean, f["size_by"], totals[k]["all_grad_sum"]) for k in ranges}
    both = pd.concat([t.assign(cloud=ranges[k][2]) for k, t in tables.items()], ignore_index=True)
    common.chart(fig, "wc_cloud", f"wordcloud_{name}", table=both)
    for col, k in zip(st.columns(2), ranges):
        col.markdown(_totals(totals[k], ranges[k][2]))
        col.dataframe(
            tables[k],
            hide_index=True,
            height=240,
            width="stretch",
            key=f"wc_table_{k}",
            column_config={
                "token": "token",
                "count": st.column_config.NumberColumn("count"),
                "grad_share": st.column_config.NumberColumn(
                    "share of the gradient",
                    format="percent",
                    help="Σ logit_grad_norm of the token / Σ over all tokens of the selection",
                ),
            },
        )


def _table(freqs: pd.DataFrame, clean: dict, size_by: str, total: float) -> pd.DataFrame:
    """[token, count, grad_share] of the cloud's words (cleaned and merged as the cloud shows them, in
    the cloud's order); grad_share is over every token of the selection (all probabilities)."""
    words = prepare_frequencies(freqs, size_by=size_by, **clean)
    every = {**clean, "max_words": None}
    counts = prepare_frequencies(freqs, **every)
    grads = prepare_frequencies(freqs, size_by="grad_sum", **every)
    return pd.DataFrame(
        {
            "token": list(words),
            "count": [int(counts.get(w, 0)) for w in words],
            "grad_share": [grads.get(w, 0.0) / total if total > 0 else 0.0 for w in words],
        }
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
