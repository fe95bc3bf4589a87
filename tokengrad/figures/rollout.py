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
from tokengrad.read.rollout_queries import (
    MISMATCH_CRITICAL,
    MISMATCH_WARNING,
    MULT_PROB_ERROR_SUSPECT,
    mismatch_level,
)
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
    first = np.ceil(df[BIN.lo].to_numpy()).astype(int)  # bin i holds the positions first..last
    last = np.ceil(df[BIN.hi].to_numpy()).astype(int) - 1
    keep = first <= last  # more bins than positions leaves bins that hold no whole position
    df, x = df[keep], position_labels(first[keep], last[keep])
    fig = _binned_gap_figure(df, x, "position in the completion", title or "Rollout gap by position")
    # categories, not dates: Plotly reads a label like "2-1" as a date when it guesses the axis type
    return fig.update_xaxes(type="category", categoryorder="array", categoryarray=x)


def position_labels(first, last) -> list[str]:
    """'0–4' per bin of positions 0..4 ('7' for one position): an en dash, never a hyphen, so the label
    is no date ('2-1' read as 2001-02-01) wherever the axis type is guessed."""
    return [f"{a}" if a == b else f"{a}–{b}" for a, b in zip(first, last)]


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


def gap_verdict(summary: dict) -> str:
    """One line: the run's mean engine mismatch against the healthy band (tokengrad.read.rollout_queries
    MISMATCH_WARNING / _CRITICAL, NeMo-RL's token_mult_prob_error), and its staleness apart where the run
    has stale rows (`summary`: rollout_queries.gap_summary)."""
    m, n = summary.get("mismatch_abs_mean", np.nan), int(np.nan_to_num(summary.get("n_scored", 0)))
    if not n or not np.isfinite(m):
        return "Mismatch: no token has an engine log-prob in this selection."
    level = mismatch_level(m)
    mult = summary.get("token_mult_prob_error", np.nan)
    words = {
        "healthy": f"healthy (below {MISMATCH_WARNING:g} nats; a sampler in the trainer's precision reads "
        "about 1e-7, bf16 engines 1e-3 to 3e-2)",
        "warning": f"above the healthy {MISMATCH_WARNING:g} nats (doctor warning; critical from "
        f"{MISMATCH_CRITICAL:g})",
        "critical": f"critical: above {MISMATCH_CRITICAL:g} nats, far outside what bf16 engines show",
    }
    line = (
        f"Mismatch (log π_old − log μ, same version): mean |d| {m:.3g} nats over {n} tokens (max "
        f"{summary.get('mismatch_abs_max', np.nan):.3g}): {words[level]}. NeMo-RL's token_mult_prob_error "
        f"mean exp(|d|) = {mult:.6g} ({'≤' if mult <= MULT_PROB_ERROR_SUSPECT else '>'} "
        f"{MULT_PROB_ERROR_SUSPECT:g}, {'fine' if mult <= MULT_PROB_ERROR_SUSPECT else 'suspicious'})."
    )
    if int(np.nan_to_num(summary.get("n_stale", 0))):
        line += (
            f" Staleness (log π_θ − log π_old, across up to {int(summary['lag_max'])} versions): mean "
            f"|Δ| {summary['staleness_abs_mean']:.3g} nats over {int(summary['n_stale'])} stale rows (max "
            f"{summary['staleness_abs_max']:.3g}): the policy's own drift since sampling, not an engine "
            "error."
        )
    return line


def make_off_policy_split_figure(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Per step, the mean |mismatch| (engine vs trainer at the sampling version) and the mean |staleness|
    (trainer vs trainer across versions) of the off-policy gap (rollout_queries.off_policy_split); log
    axis when every value is > 0."""
    if df is None or df.empty:
        return empty_figure(NO_ROLLOUT, title)
    fig = go.Figure()
    series = (
        ("mismatch_abs_mean", "mean |log π_old − log μ|: mismatch", "#0072B2"),
        ("staleness_abs_mean", "mean |log π_θ − log π_old|: staleness", "#D55E00"),
    )
    shown = []
    for col, name, color in series:
        part = df[df[col].notna()]
        if not part.empty:
            fig.add_trace(
                go.Scatter(
                    x=part[STEP.step], y=part[col], name=name, mode="lines+markers", line=dict(color=color)
                )
            )
            shown.append(part[col])
    if not shown:
        return empty_figure(NO_ROLLOUT, title)
    positive = bool((pd.concat(shown) > 0).all())
    fig.update_yaxes(title_text="nats per token", type="log" if positive else "linear")
    fig.update_xaxes(title_text="step")
    integer_step_axis(fig, df[STEP.step])
    return dashboard_layout(fig, title or "Off-policy gap per step: staleness and mismatch apart")
