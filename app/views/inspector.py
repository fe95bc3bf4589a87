"""Token inspector: one completion coloured token by token, and spike forensics for one step."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data
from app.views import common
from tokengrad.figures.overview import grad_norm_series, step_series
from tokengrad.figures.smoothing import find_spikes
from tokengrad.figures.tokens import make_token_figure, token_html
from tokengrad.schema import SAMPLE, STEP, TOK

COLOR_BY = (TOK.prob, TOK.weight, TOK.coef, TOK.logit_grad_norm, TOK.head_grad_norm, TOK.entropy,
            TOK.advantage, TOK.logprob, TOK.ratio)
RANK_BY = (TOK.logit_grad_norm, TOK.head_grad_norm, TOK.logit_grad_unit)
SHARE = {"share": st.column_config.ProgressColumn("share", format="percent", min_value=0.0, max_value=1.0)}


def _spike_steps(run: str) -> list[int]:
    """Steps whose pre-clip gradient norm is a spike (layers total, else the steps table)."""
    gn = grad_norm_series(data.table(run, "layers"))
    if gn.empty:
        gn = step_series(data.table(run, "steps"), STEP.grad_norm)
    if gn.empty:
        return []
    return [int(s) for s in gn[STEP.step].to_numpy()[find_spikes(gn[STEP.grad_norm].to_numpy())]]


def _step_ui(run: str) -> int:
    steps = data.query(run, "token_steps")
    spikes = [s for s in _spike_steps(run) if s in set(steps)]
    if st.session_state.get("in_step") not in steps:  # first visit, or another run: a spike, else the last
        st.session_state["in_step"] = spikes[0] if spikes else steps[-1]
    c1, c2 = st.columns([3, 2])
    if spikes:
        jump = c2.selectbox("Jump to a gradient-norm spike", ["-"] + spikes, key="in_spike")
        if jump != "-" and st.session_state.get("in_last_jump") != jump:
            st.session_state["in_last_jump"] = jump
            st.session_state["in_step"] = jump
    else:
        c2.caption("No gradient-norm spikes in this run.")
    if len(steps) == 1:
        return steps[0]
    return int(c1.select_slider("Step", steps, key="in_step"))


def _forensics(run: str, step: int) -> None:
    value = st.radio("Rank by", RANK_BY, horizontal=True, key="in_rank_by")
    c1, c2 = st.columns(2)
    with c1:
        st.markdown("**Samples carrying most of the step's gradient**")
        samples = data.query(run, "top_samples", step=step, k=10, value=value)
        st.dataframe(
            samples,
            hide_index=True,
            width="stretch",
            key="in_top_samples",
            column_config=SHARE,
            column_order=[
                "sample_id",
                "share",
                SAMPLE.reward,
                "n_tokens",
                "prob_mean",
                TOK.advantage,
                f"{value}_sum",
                TOK.group_id,
                SAMPLE.completion,
            ],
        )
    with c2:
        st.markdown("**Tokens carrying most of the step's gradient**")
        tokens = data.query(run, "top_tokens", step=step, k=20, value=value)
        st.dataframe(
            tokens,
            hide_index=True,
            width="stretch",
            key="in_top_tokens",
            column_config=SHARE,
            column_order=[
                TOK.token,
                "share",
                TOK.prob,
                TOK.coef,
                TOK.weight,
                TOK.advantage,
                value,
                TOK.sample_id,
                TOK.position,
                TOK.entropy,
                TOK.clipped,
                TOK.group_id,
            ],
        )


def _pct(x) -> str:
    return f"{x:.1%}" if pd.notna(x) else "n/a"  # NaN share: the step's gradient is 0


def _num(x) -> str:
    return f"{x:.3g}" if pd.notna(x) else "n/a"


def _completion(run: str, step: int) -> None:
    ranked = data.query(run, "top_samples", step=step, k=100_000)
    if ranked.empty:
        st.info(f"No token rows at step {step}.")
        return
    labels = {
        int(
            r.sample_id
        ): f"sample {int(r.sample_id)}: {_pct(r.share)} of the gradient, reward {_num(r.reward)}"
        for r in ranked.itertuples()
    }
    c1, c2 = st.columns([3, 2])
    sample = c1.selectbox(
        "Completion (ranked by gradient share)", list(labels), format_func=labels.get, key="in_sample"
    )
    color_by = c2.selectbox("Colour tokens by", COLOR_BY, key="in_color")
    tokens = data.query(run, "sample_tokens", step=step, sample_id=sample)
    if tokens.empty or color_by not in tokens or tokens[color_by].isna().all():
        st.info(f"'{color_by}' was not recorded for this completion; pick another colour.")
        return
    st.html(token_html(tokens, color_by))
    st.caption("Hover a token for every value recorded for it; faded tokens are outside the loss.")
    with st.expander("Prompt and completion text"):
        samples = data.table(run, "samples")
        row = samples[(samples[SAMPLE.step] == step) & (samples[SAMPLE.sample_id] == sample)]
        st.text(row[SAMPLE.prompt].iloc[0] if len(row) else "(no samples table row for this completion)")
        st.text(row[SAMPLE.completion].iloc[0] if len(row) else "")
    with st.expander("As a chart (for download)"):
        common.chart(
            make_token_figure(tokens, color_by, title=f"step {step}, sample {sample}: {color_by}"),
            "in_tokens",
            f"tokens_{common.run_name(run)}_s{step}_{sample}_{color_by}",
        )


def render() -> None:
    st.title("Token inspector")
    runs = common.require_runs()
    run = common.pick_token_run(runs, "in_run")
    if run is not None:
        with common.guard("Step"):
            step = _step_ui(run)
            st.subheader(f"Spike forensics: step {step}")
            with common.guard("Spike forensics"):
                _forensics(run, step)
            st.subheader("Completion")
            with common.guard("Completion"):
                _completion(run, step)
    common.show_run_warnings(runs)


render()
