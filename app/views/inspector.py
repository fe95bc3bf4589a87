"""Token inspector: one completion coloured token by token, and spike forensics for one step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from app import data
from app.views import common
from tokengrad.figures.gradnorms import run_grad_norms
from tokengrad.figures.liveness import live_mask
from tokengrad.figures.smoothing import find_spikes
from tokengrad.figures.tokens import make_token_figure, token_html
from tokengrad.schema import SAMPLE, STEP, TOK

COLOR_BY = (
    TOK.prob,
    TOK.weight,
    TOK.coef,
    TOK.logit_grad_norm,
    TOK.head_grad_norm,
    TOK.entropy,
    TOK.advantage,
    TOK.logprob,
    TOK.ratio,
    TOK.update_share,
    TOK.entropy_share,
    TOK.dentropy,
)
RANK_BY = (TOK.logit_grad_norm, TOK.head_grad_norm, TOK.logit_grad_unit)
# with per-token attribution recorded, a token's exact share of the update ranks first (arXiv 2505.12929's
# question answered exactly: its own gradient norm ignores how tokens' gradients cancel or align)
RANK_BY_ATTRIBUTED = (TOK.update_share, *RANK_BY)
SHARE = {"share": st.column_config.ProgressColumn("share", format="percent", min_value=0.0, max_value=1.0)}


def _grad_norms(run: str) -> pd.DataFrame:
    """[step, grad_norm] of the whole model (layers total, else the steps table)."""
    return run_grad_norms(data.table(run, "layers"), data.table(run, "steps"))


def _spike_steps(gn: pd.DataFrame) -> list[int]:
    """Steps whose pre-clip gradient norm is a spike among the live steps."""
    if gn.empty:
        return []
    values = gn[STEP.grad_norm].to_numpy()
    live = np.flatnonzero(live_mask(values))
    return [int(s) for s in gn[STEP.step].to_numpy()[live[find_spikes(values[live])]]]


def _ranges(steps: list[int]) -> str:
    """'3-5, 7, 11' for [3, 4, 5, 7, 11]."""
    out: list[list[int]] = []
    for s in steps:
        if out and s == out[-1][-1] + 1:
            out[-1].append(s)
        else:
            out.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def _largest_step(steps: list[int], per_step: pd.DataFrame, gn: pd.DataFrame) -> int:
    """The token step with the largest gradient norm (recorded norm, else the summed token norms)."""
    norms = gn.set_index(STEP.step)[STEP.grad_norm].reindex(steps) if not gn.empty else pd.Series(dtype=float)
    if norms.notna().any() and norms.max() > 0:
        return int(norms.idxmax())
    sums = per_step.set_index(TOK.step)["grad_sum"].reindex(steps)
    return int(sums.idxmax()) if sums.notna().any() and sums.max() > 0 else steps[-1]


def _step_ui(run: str) -> tuple[int, bool]:
    """The inspected step and whether it had a gradient."""
    steps = data.query(run, "token_steps")
    per_step = data.query(run, "step_gradients")
    live = {int(s) for s in per_step.loc[per_step["live"], TOK.step]}
    gn = _grad_norms(run)
    spikes = [s for s in _spike_steps(gn) if s in set(steps)]
    if st.session_state.get("in_step") not in steps:  # first visit, or another run: the largest gradient
        st.session_state["in_step"] = _largest_step(steps, per_step, gn)
    c1, c2 = st.columns([3, 2])
    if spikes:
        jump = c2.selectbox("Jump to a gradient-norm spike", ["-"] + spikes, key="in_spike")
        if jump != "-" and st.session_state.get("in_last_jump") != jump:
            st.session_state["in_last_jump"] = jump
            st.session_state["in_step"] = jump
    else:
        c2.caption("No gradient-norm spikes among the live steps.")
    if len(steps) > 1:
        c1.select_slider(
            "Step",
            steps,
            key="in_step",
            format_func=lambda s: f"{s} ●" if s in live else f"{s} (no gradient)",
            help="● marks steps with a gradient; the others had every advantage 0.",
        )
    c1.caption(f"Steps with a gradient (●): {_ranges(sorted(live)) or 'none'} — {len(live)} of {len(steps)}.")
    step = int(st.session_state["in_step"]) if len(steps) > 1 else steps[0]
    return step, step in live


DEAD_STEP = (
    "Step {step} had no gradient: every advantage was 0 (each group's completions got the same "
    "reward), so every token's coef and logit_grad_norm are 0 and there is nothing to rank. "
    "Pick a step marked ● on the slider."
)


def _forensics(run: str, step: int) -> None:
    ranks = RANK_BY_ATTRIBUTED if data.query(run, "attributed_steps") else RANK_BY
    value = st.radio("Rank by", ranks, horizontal=True, key="in_rank_by")
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
    return f"{x:.1%}" if pd.notna(x) else "no gradient"  # undefined share: the step's gradient is 0


def _num(x) -> str:
    return f"{x:.3g}" if pd.notna(x) else "not recorded"


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
    wanted = st.session_state.pop("in_sample", None)  # from a finding's link (urlstate "sample")
    if wanted in labels:
        st.session_state[f"in_sample_{step}"] = wanted
    c1, c2 = st.columns([3, 2])
    sample = c1.selectbox(  # keyed by step: another step's completions never keep a stale label
        "Completion (ranked by gradient share)", list(labels), format_func=labels.get, key=f"in_sample_{step}"
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
            step, live = _step_ui(run)
            st.subheader(f"Spike forensics: step {step}")
            with common.guard("Spike forensics"):
                if live:
                    _forensics(run, step)
                else:
                    st.info(DEAD_STEP.format(step=step), icon=":material/block:")
            st.subheader("Completion")
            with common.guard("Completion"):
                _completion(run, step)
    common.show_run_warnings(runs)


render()
