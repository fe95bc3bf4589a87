"""What if: on the analysed steps, the gradient each other weighting rule would have produced from the same
parameters on the same batch (the `whatif` table, buckets/whatif.py) beside the update the run made: the
pre-clip norm trajectories with the actual update's spikes marked, the probability-bucket shares side by
side, and each rule's cosine to the actual update (tokengrad.read.whatif_frames, tokengrad.figures.whatif)."""

from __future__ import annotations

import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common
from tokengrad.app.views.hints import hint
from tokengrad.figures.whatif import (
    make_whatif_cos_figure,
    make_whatif_norm_figure,
    make_whatif_share_figure,
    spike_steps,
)
from tokengrad.read.whatif_frames import ACTUAL, bucket_share_table, norm_trajectories, step_comparison

STEP_KEY = "wi_step"
LINKED_STEP = "in_step"  # where tokengrad/app/views/urlstate.py puts the URL's step (a doctor finding's link)


def _step_numbers(run: str, norms, spikes: list[int]) -> None:
    """One analysed step in numbers: each rule's norm and low-probability share against the actual ones."""
    steps = sorted(int(s) for s in norms.step.unique())
    wanted = st.session_state.get(STEP_KEY, st.session_state.get(LINKED_STEP))  # a finding's link: ?step=
    default = wanted if wanted in steps else (spikes[0] if spikes else steps[-1])
    step = st.select_slider("Analysed step", options=steps, value=default, key=STEP_KEY)
    rows = step_comparison(
        data.table(run, "whatif"), data.table(run, "layers"), data.table(run, "buckets"), step=step
    )
    for r in rows:
        low = (
            f"; its p < 0.25 share {r['low_share']:.0%} instead of {r['actual_low_share']:.0%}"
            if r["low_share"] == r["low_share"] and r["actual_low_share"] == r["actual_low_share"]
            else ""
        )
        st.markdown(
            f"**{r['rule']}** would have made step {step}'s update {r['norm']:.3g} instead of "
            f"{r['actual_norm']:.3g}{low} (cosine to the actual update {r['cos']:.2f})."
        )


def render() -> None:
    st.title("What if")
    runs = common.require_runs()
    run = common.pick_one(runs, "wi_run")
    name = common.run_name(run)
    whatif = data.table(run, "whatif")
    if whatif.empty:
        common.empty(f"No what-if rows in {name}.", hint(data.meta(run), "whatif"))
        common.show_run_warnings(runs)
        return
    st.caption(
        "Each rule's update is computed from the same parameters on the same batch as the actual one, from "
        "the recorded log-probs, advantages and masks; the optimizer and the run are untouched. Lopti shows "
        "its first phase."
    )
    norms = norm_trajectories(whatif, data.table(run, "layers"))
    spikes = spike_steps(norms)
    with common.guard("Gradient norm"):
        common.chart(make_whatif_norm_figure(norms), "wi_norms", f"whatif_norms_{name}", table=norms)
    with common.guard("Step in numbers"):
        _step_numbers(run, norms, spikes)
    step_range = common.step_range_ui(run, "wi_steps_range")
    with common.guard("Bucket shares"):
        shares = bucket_share_table(whatif, data.table(run, "buckets"), step_range)
        common.chart(make_whatif_share_figure(shares), "wi_shares", f"whatif_shares_{name}", table=shares)
    with common.guard("Cosine"):
        common.chart(
            make_whatif_cos_figure(norms), "wi_cos", f"whatif_cos_{name}", table=norms[norms.series != ACTUAL]
        )
    common.show_run_warnings(runs)


render()
