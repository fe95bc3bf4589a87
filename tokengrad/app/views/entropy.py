"""Entropy: which tokens' updates moved the mean token entropy (Attribution(entropy=True)), by probability
bucket x advantage sign, by position, the predicted against the measured change per step, and the tokens
that drained the most (tokengrad.read.entropy_queries; record/attribution/entropy.py for the formulas)."""

from __future__ import annotations

import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common
from tokengrad.figures.entropy import (
    make_entropy_law_figure,
    make_entropy_position_figure,
    make_entropy_quadrant_figure,
    make_entropy_steps_figure,
)
from tokengrad.read.entropy_law import entropy_law_fit
from tokengrad.read.entropy_queries import DRAIN, DRAINER_COLUMNS, STEP_COLUMNS
from tokengrad.schema import STEP

HOW = (
    "Record it with `Recorder(..., attribution=Attribution(every=N, entropy=True))` (recompute= returning "
    "(log-probs, entropy)) or train with `attribute_every=N` and `attribute_entropy=true`."
)


def _steps(run: str, name: str) -> None:
    steps = data.table(run, "steps")
    if STEP.dentropy_mean not in steps.columns or steps[STEP.dentropy_mean].isna().all():
        common.empty(f"No entropy attribution in {name}.{common.lost_note(run, 'steps')}", HOW)
        common.show_run_warnings([run])  # what could not be read, before the page stops
        st.stop()
    rows = steps.dropna(subset=[STEP.dentropy_mean_pred])
    rows = rows[rows[STEP.rank] == rows[STEP.rank].min()][[c for c in STEP_COLUMNS if c in rows.columns]]
    common.chart(make_entropy_steps_figure(rows), "en_steps", f"entropy_steps_{name}", table=rows)


def _law(run: str, name: str, step_range) -> None:
    st.subheader("The entropy law per token (arXiv 2602.03392)")
    st.caption(
        "A logit step ε on the sampled token changes its position's entropy by −ε·p·(H + log p) to first "
        "order (Thm. 3.2); ε is read off the token's own measured probability change, "
        "ε = dlogprob / (1 − p). Points on y = x: the entropy moved as the token's own logit step "
        "predicts; the rest of the change comes from the other logits of the position, which every other "
        "token's gradient also moves."
    )
    df = data.query(run, "entropy_law", steps=step_range)
    fit = entropy_law_fit(df)
    common.chart(make_entropy_law_figure(df), "en_law", f"entropy_law_{name}", table=fit)


def render() -> None:
    st.title("Entropy")
    runs = common.require_runs()
    run = common.pick_token_run(runs, "en_run")
    if run is not None:
        name = common.run_name(run)
        with common.guard("Predicted vs measured"):
            _steps(run, name)
        step_range = common.step_range_ui(run, "en_steps_range")
        with common.guard("Quadrants"):
            df = data.query(run, "entropy_quadrants", steps=step_range)
            common.chart(make_entropy_quadrant_figure(df), "en_quad", f"entropy_quadrants_{name}", table=df)
        with common.guard("By position"):
            df = data.query(run, "entropy_by_position", steps=step_range, bins=10)
            common.chart(make_entropy_position_figure(df), "en_pos", f"entropy_position_{name}", table=df)
        with common.guard("Entropy law per token"):
            _law(run, name, step_range)
        with common.guard("Top drainers"):
            st.subheader("Tokens that drained the most entropy")
            st.caption(
                f"`{DRAIN}` = entropy_share x <grad H, g>: the part of the first-order entropy change along "
                "the gradient this token's gradient makes (a step -lr g changes the mean entropy by "
                "-lr times the sum); open a sample in the Token inspector to read it in context."
            )
            top = data.query(run, "entropy_drainers", steps=step_range, k=25)
            st.dataframe(top[[*DRAINER_COLUMNS, DRAIN, "drain_share"]], hide_index=True)
    common.show_run_warnings(runs)


render()
