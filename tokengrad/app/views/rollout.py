"""Rollout vs trainer: where the engine that sampled (mu) and the trainer (pi_old) disagree, by probability
and position, the gap per step next to the gradient norm, the share of the update made by tokens whose gap
exceeds tau, and the sequences a mask removed, each linked to the token inspector
(tokengrad.read.rollout_queries, tokengrad.figures.rollout; docs/rollout.md)."""

from __future__ import annotations

import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common, findings, urlstate
from tokengrad.figures.rollout import (
    gap_verdict,
    make_gap_by_position_figure,
    make_gap_by_prob_figure,
    make_gap_trajectory_figure,
    make_mismatch_share_figure,
    make_off_policy_split_figure,
    mismatch_summary,
)
from tokengrad.read.pages import INSPECTOR, page_url
from tokengrad.schema import SAMPLE, TOK

NO_ROLLOUT = (
    "It is written by the built-in trainer (every sampled step: the sampler's log-prob after temperature "
    "and top-p, `bf16=true` for a bf16 sampler), by the TRL attach when TRL hands its loss "
    "`sampling_per_token_logps` (`use_vllm=True`, or a `rollout_func` returning `logprobs`; TRL's own "
    "generate() keeps none) and by `st.track(..., rollout_logprobs=...)` in a custom loop. Greedy decoding "
    "has no sampling distribution, so none is recorded. See docs/rollout.md."
)
TAU_KEY, MASKED_KEY = "ro_tau", "ro_masked"
TAUS = (0.001, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0)


def inspector_query(run: str, step: int, sample_id: int) -> dict[str, str]:
    """The URL query (urlstate.py) that opens the token inspector on this run, step and sample."""
    return {"runs": common.run_name(run), "step": str(int(step)), "sample": str(int(sample_id))}


def _masked(run: str, step_range) -> None:
    st.subheader("Sequences a mask removed")
    df = data.query(run, "masked_sequences", step_range=step_range)
    if df.empty:
        st.caption(
            "No token was masked in these steps (`rollout_correction` = token_mask / sequence_mask in the "
            "built-in trainer; TRL's vllm_importance_sampling_mode, off_policy_mask_threshold and "
            "top_entropy_quantile)."
        )
        return
    df["inspector"] = [
        page_url(INSPECTOR, inspector_query(run, s, i)) for s, i in zip(df[TOK.step], df[TOK.sample_id])
    ]
    st.caption(
        f"{len(df)} sequences with masked tokens; `rollout_seq_log_ratio` = Σ_t (log π_old − log μ), the log "
        "of TRL's sequence IS ratio. Click a row, or its link, to open it in the Token inspector."
    )
    event = st.dataframe(
        df,
        hide_index=True,
        width="stretch",
        key=MASKED_KEY,
        on_select="rerun",
        selection_mode="single-row",
        column_config={"inspector": st.column_config.LinkColumn("open", display_text="token inspector")},
        column_order=[
            TOK.step,
            TOK.sample_id,
            TOK.masked_by,
            "n_masked",
            "n_tokens",
            SAMPLE.reward,
            SAMPLE.advantage,
            SAMPLE.rollout_seq_log_ratio,
            SAMPLE.rollout_gap_mean,
            "inspector",
        ],
    )
    rows = list(getattr(getattr(event, "selection", None), "rows", None) or [])
    if rows and rows[0] < len(df):
        r = df.iloc[rows[0]]
        q = inspector_query(run, r[TOK.step], r[TOK.sample_id])
        findings.open_finding({"query": q, "run_dir": run, "page": INSPECTOR})


def _confident(run: str, step_range) -> None:
    st.subheader("Confident disagreements")
    df = data.query(run, "confident_disagreements", step_range=step_range, limit=200)
    if df.empty:
        st.caption("No loss token where one side gives p > 0.9 and the other p < 0.1.")
        return
    st.caption(
        f"{len(df)} tokens (at most 200 shown) where the trainer's π_old gives p > 0.9 and the engine "
        "p < 0.1, or the reverse: a sampler at another temperature or precision, not rounding."
    )
    st.dataframe(df, hide_index=True, width="stretch")


def _share(run: str, step_range) -> None:
    st.subheader("Update share of the mismatched tokens")
    urlstate.default(TAU_KEY, 0.1)
    tau = st.select_slider(
        "τ: |log π_old − log μ| above which a token counts as mismatched (nats)", options=TAUS, key=TAU_KEY
    )
    df = data.query(run, "mismatch_update_share", tau=float(tau), step_range=step_range)
    s = mismatch_summary(df)
    if s["n_updates"]:
        st.caption(
            f"Tokens with |d| > {tau:g}: {s['token_share']:.1%} of the scored tokens, "
            f"{s['update_share']:.1%} of an update on average ({s['n_updates']} updates with attribution). "
            "Under a token budget only the kept rows count."
        )
    common.chart(
        make_mismatch_share_figure(df, float(tau)),
        "ro_share",
        f"rollout_share_{common.run_name(run)}",
        table=df,
    )


def render() -> None:
    st.title("Rollout vs trainer")
    runs = common.require_runs()
    run = common.pick_token_run(runs, "ro_run")
    if run is None:
        common.show_run_warnings(runs)
        return
    name = common.run_name(run)
    if not data.query(run, "has_rollout"):
        common.empty(f"No rollout_logprob in {name}: the engine's log-probs were not recorded.", NO_ROLLOUT)
        common.show_run_warnings(runs)
        return
    with common.guard("Verdict"):
        st.markdown(gap_verdict(data.query(run, "gap_summary")))
    if data.query(run, "has_staleness"):
        with common.guard("Staleness and mismatch"):
            df = data.query(run, "off_policy_split")
            common.chart(make_off_policy_split_figure(df), "ro_split", f"rollout_split_{name}", table=df)
    with common.guard("Gap per step"):
        common.chart(
            make_gap_trajectory_figure(data.table(run, "steps")), "ro_steps", f"rollout_steps_{name}"
        )
    step_range = common.step_range_ui(run, "ro_steps_range")
    with common.guard("Gap by probability"):
        df = data.query(run, "gap_by_prob", bins=10, step_range=step_range)
        common.chart(make_gap_by_prob_figure(df), "ro_prob", f"rollout_prob_{name}", table=df)
    with common.guard("Gap by position"):
        df = data.query(run, "gap_by_position", bins=10, step_range=step_range)
        common.chart(make_gap_by_position_figure(df), "ro_pos", f"rollout_position_{name}", table=df)
    with common.guard("Update share"):
        _share(run, step_range)
    with common.guard("Masked sequences"):
        _masked(run, step_range)
    with common.guard("Confident disagreements"):
        _confident(run, step_range)
    common.show_run_warnings(runs)


render()
