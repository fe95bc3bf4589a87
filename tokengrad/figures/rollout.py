"""Rollout vs trainer figures: the gap d = log pi_old - log mu between the engine that sampled and the
trainer, from tokengrad.read.rollout_queries frames and the steps table.

    make_gap_by_prob_figure(gap_by_prob(run))             # |d| and the signed mean per probability bin
    make_gap_by_position_figure(gap_by_position(run))     # the same along the completion
    make_gap_trajectory_figure(run.steps)                 # mean / max |d| per step next to the grad norm
    make_mismatch_share_figure(mismatch_update_share(run, tau=0.1), tau=0.1)

Signed means below 0 are tokens the engine gave more mass than the trainer (a top-p / top-k sampler
renormalises over the kept tokens: log pi_old - log mu = log S < 0, S the kept mass).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.curves import step_series
from tokengrad.figures.style import add_caption, dashboard_layout, empty_figure, integer_step_axis
from tokengrad.schema import BIN, STEP, TOK

NO_ROLLOUT = "no rollout_logprob in this selection (the engine's log-probs were not recorded)"
NO_SHARES = "no attribution steps with rollout_logprob (attribution=N / attribute_every=N)"
LABELS = {
    "abs_gap_mean": "mean |log π_old − log μ| (nats)",
    "abs_gap_max": "max |log π_old − log μ| (nats)",
    "gap_mean": "mean log π_old − log μ (nats)",
    STEP.rollout_mismatch: "mean |log π_old − log μ| (nats)",
    STEP.rollout_mismatch_max: "max |log π_old − log μ| (nats)",
    STEP.grad_norm: "gradient norm",
}


def _binned_gap_figure(df: pd.DataFrame, x, x_title: str, title: str) -> go.Figure:
    """Bars of the mean |d| per bin (hover: the max and the token count) and the signed mean as a line."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    custom = df[[BIN.count, "abs_gap_max"]].to_numpy()
    fig.add_trace(
        go.Bar(
            x=x,
            y=df["abs_gap_mean"],
            name=LABELS["abs_gap_mean"],
            marker_color="#0072B2",
            customdata=custom,
            hovertemplate="%{x}<br>mean |d| %{y:.3g}<br>max |d| %{customdata[1]:.3g}"
            "<br>%{customdata[0]} tokens<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=x, y=df["gap_mean"], name=LABELS["gap_mean"], mode="lines+markers", line=dict(color="#D55E00")
        ),
        secondary_y=True,
    )
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text="|d| (nats)", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="signed d (nats)", secondary_y=True, zeroline=True)
    return dashboard_layout(fig, title)


def make_gap_by_prob_figure(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """The gap per bin of the trainer's probability (gap_by_prob): where the engine disagrees."""
    if df is None or df.empty or int(df[BIN.count].sum()) == 0:
        return empty_figure(NO_ROLLOUT, title)
    x = [f"[{lo:.2f}, {hi:.2f})" for lo, hi in df[[BIN.lo, BIN.hi]].to_numpy()]
    fig = _binned_gap_figure(df, x, "trainer probability π_old", title or "Rollout gap by token probability")
    return add_caption(fig, f"{int(df[BIN.count].sum())} scored loss tokens")


def make_gap_by_position_figure(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """The gap per bin of the token position (gap_by_position)."""
    if df is None or df.empty or int(df[BIN.count].sum()) == 0:
        return empty_figure(NO_ROLLOUT, title)
    x = [f"{int(np.ceil(lo))}-{int(np.ceil(hi)) - 1}" for lo, hi in df[[BIN.lo, BIN.hi]].to_numpy()]
    return _binned_gap_figure(df, x, "position in the completion", title or "Rollout gap by position")


def make_gap_trajectory_figure(steps: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Two panels over steps: the mean and max |d| (steps.rollout_mismatch, _max; log axis), and the
    pre-clip gradient norm, so a growing gap can be read against the update's size."""
    gap = step_series(steps, STEP.rollout_mismatch) if steps is not None else pd.DataFrame()
    if gap.empty:
        return empty_figure(NO_ROLLOUT, title)
    top = step_series(steps, STEP.rollout_mismatch_max)
    norm = step_series(steps, STEP.grad_norm)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for frame, col, dash in ((gap, STEP.rollout_mismatch, "solid"), (top, STEP.rollout_mismatch_max, "dot")):
        if not frame.empty:
            fig.add_trace(
                go.Scatter(
                    x=frame[STEP.step],
                    y=frame[col],
                    name=LABELS[col],
                    mode="lines+markers",
                    line=dict(dash=dash),
                ),
                row=1,
                col=1,
            )
    if not norm.empty:
        fig.add_trace(
            go.Scatter(
                x=norm[STEP.step],
                y=norm[STEP.grad_norm],
                name=LABELS[STEP.grad_norm],
                mode="lines+markers",
                line=dict(color="#009E73"),
            ),
            row=2,
            col=1,
        )
    positive = (gap[STEP.rollout_mismatch] > 0).all()
    fig.update_yaxes(title_text="|d| (nats)", type="log" if positive else "linear", row=1, col=1)
    fig.update_yaxes(title_text=LABELS[STEP.grad_norm], row=2, col=1)
    fig.update_xaxes(title_text="step", row=2, col=1)
    integer_step_axis(fig, gap[STEP.step])
    return dashboard_layout(fig, title or "Rollout gap and gradient norm per step")


def mismatch_summary(df: pd.DataFrame) -> dict[str, float]:
    """Pooled over the frame's updates (mismatch_update_share): the mean share of one update made by the
    mismatched tokens, their share of the scored tokens, and the counts."""
    if df is None or df.empty:
        return {
            "n_updates": 0,
            "n_mismatched": 0,
            "n_scored": 0,
            "update_share": np.nan,
            "token_share": np.nan,
        }
    n_scored, n_far = int(df["n_scored"].sum()), int(df["n_mismatched"].sum())
    return {
        "n_updates": len(df),
        "n_mismatched": n_far,
        "n_scored": n_scored,
        "update_share": float(df[TOK.update_share].mean()),
        "token_share": n_far / n_scored if n_scored else np.nan,
    }


def make_mismatch_share_figure(df: pd.DataFrame, tau: float, title: str | None = None) -> go.Figure:
    """Per attribution step: the share of the update made by the tokens with |d| > tau (bars, summed
    over the step's updates and divided by their number) against their share of the scored tokens."""
    if df is None or df.empty or int(df["n_scored"].sum()) == 0:
        return empty_figure(NO_SHARES, title)
    per = df.groupby(TOK.step).agg(
        update_share=(TOK.update_share, "mean"),
        n_mismatched=("n_mismatched", "sum"),
        n_scored=("n_scored", "sum"),
    )
    per["token_share"] = per["n_mismatched"] / per["n_scored"].where(per["n_scored"] > 0)
    steps = per.index.to_numpy()
    fig = go.Figure()
    fig.add_trace(
        go.Bar(
            x=steps,
            y=per[TOK.update_share],
            name="share of the update",
            marker_color="#D55E00",
            customdata=per[["n_mismatched", "n_scored"]].to_numpy(),
            hovertemplate="step %{x}<br>share of the update %{y:.1%}"
            "<br>%{customdata[0]} of %{customdata[1]} tokens<extra></extra>",
        )
    )
    fig.add_trace(go.Scatter(x=steps, y=per["token_share"], name="share of the tokens", mode="lines+markers"))
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text=f"tokens with |d| > {tau:g} nats", tickformat=".0%")
    integer_step_axis(fig, steps)
    s = mismatch_summary(df)
    fig = dashboard_layout(fig, title or f"Update share of tokens with |log π_old − log μ| > {tau:g}")
    return add_caption(
        fig,
        f"{s['n_mismatched']} of {s['n_scored']} scored tokens made {s['update_share']:.1%} of an update "
        f"on average over {s['n_updates']} updates",
    )
