"""Entropy attribution figures (record/attribution/entropy.py) from tokengrad.read.entropy_queries frames:

    make_entropy_quadrant_figure(entropy_quadrants(run))   # probability bucket x advantage sign
    make_entropy_position_figure(entropy_by_position(run))  # along the completion
    make_entropy_steps_figure(entropy_steps(run))           # predicted vs measured change of the mean entropy
    make_entropy_law_figure(entropy_law(run))               # arXiv 2602.03392's per-token law vs measured

A cell's entropy_share is its tokens' part of their update's first-order entropy change along the gradient
(summed per update); dentropy / dentropy_pred are the mean per-position change along the applied update.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.style import dashboard_layout, empty_figure
from tokengrad.read.entropy_law import LAW_PRED, law_fit
from tokengrad.schema import STEP, TOK

NO_ENTROPY = "no entropy attribution in this selection (Attribution(entropy=True) / attribute_entropy)"
SIGN_NAMES = {-1: "A < 0", 0: "A = 0", 1: "A > 0"}
SIGN_COLORS = {-1: "#D55E00", 0: "#999999", 1: "#0072B2"}
LABELS = {
    TOK.entropy_share: "share of the entropy change along g",
    TOK.dentropy: "measured ΔH per position (nats)",
    TOK.dentropy_pred: "predicted ΔH per position (nats)",
    STEP.dentropy_mean: "measured ΔH̄ (nats)",
    STEP.dentropy_mean_pred: "predicted ΔH̄ (nats)",
}


def _bucket_label(lo: float, hi: float) -> str:
    return f"[{lo:.2f}, {hi:.2f})"


def make_entropy_quadrant_figure(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Two panels over probability buckets, one bar per advantage sign: each cell's share of the entropy
    change along the gradient, and the measured mean entropy change at its positions."""
    if df is None or df.empty:
        return empty_figure(NO_ENTROPY, title)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(LABELS[TOK.entropy_share], LABELS[TOK.dentropy]))
    order = [_bucket_label(lo, hi) for lo, hi in df[["lo", "hi"]].drop_duplicates().to_numpy()]
    for sign, part in df.groupby("adv_sign"):
        x = [_bucket_label(lo, hi) for lo, hi in part[["lo", "hi"]].to_numpy()]
        name, color = SIGN_NAMES.get(int(sign), str(sign)), SIGN_COLORS.get(int(sign))
        custom = part[["n_tokens"]].to_numpy()
        for col, value in ((1, TOK.entropy_share), (2, TOK.dentropy)):
            fig.add_trace(
                go.Bar(
                    x=x,
                    y=part[value],
                    name=name,
                    marker_color=color,
                    legendgroup=name,
                    showlegend=col == 1,
                    customdata=custom,
                    hovertemplate=f"%{{x}} {name}<br>%{{y:.3g}}<br>%{{customdata[0]}} tokens<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="probability bucket", categoryorder="array", categoryarray=order)
    return dashboard_layout(fig, title or "Entropy change by probability and advantage sign", barmode="group")


def make_entropy_position_figure(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Share of the entropy change along g (bars) and the predicted / measured mean change per position
    (lines) over position bins."""
    if df is None or df.empty:
        return empty_figure(NO_ENTROPY, title)
    x = (df["lo"].to_numpy(float) + df["hi"].to_numpy(float)) / 2
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Bar(x=x, y=df[TOK.entropy_share], name=LABELS[TOK.entropy_share], opacity=0.5))
    for col, dash in ((TOK.dentropy_pred, "dot"), (TOK.dentropy, "solid")):
        fig.add_trace(
            go.Scatter(x=x, y=df[col], name=LABELS[col], mode="lines+markers", line=dict(dash=dash)),
            secondary_y=True,
        )
    fig.update_xaxes(title_text="position in the completion")
    fig.update_yaxes(title_text="share", secondary_y=False)
    fig.update_yaxes(title_text="ΔH per position (nats)", secondary_y=True)
    return dashboard_layout(fig, title or "Entropy change by position")


def prediction_fit(df: pd.DataFrame) -> dict[str, float]:
    """Pearson r and least-squares slope of measured on predicted ΔH̄ over the steps that have both."""
    both = df[[STEP.dentropy_mean_pred, STEP.dentropy_mean]].dropna() if not df.empty else df
    if len(both) < 2:
        return {"n": float(len(both)), "r": float("nan"), "slope": float("nan")}
    pred, meas = both[STEP.dentropy_mean_pred].to_numpy(float), both[STEP.dentropy_mean].to_numpy(float)
    r = float(np.corrcoef(pred, meas)[0, 1]) if pred.std() > 0 and meas.std() > 0 else float("nan")
    slope = float(np.polyfit(pred, meas, 1)[0]) if pred.std() > 0 else float("nan")
    return {"n": float(len(both)), "r": r, "slope": slope}


def make_entropy_steps_figure(df: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Measured against predicted change of the mean entropy, one point per attributed step, with the
    y = x line where the first-order picture holds."""
    fit = prediction_fit(df)
    if fit["n"] < 1:
        return empty_figure(NO_ENTROPY, title)
    both = df.dropna(subset=[STEP.dentropy_mean_pred, STEP.dentropy_mean])
    pred, meas = both[STEP.dentropy_mean_pred], both[STEP.dentropy_mean]
    lim = float(max(pred.abs().max(), meas.abs().max())) or 1.0
    fig = go.Figure(
        go.Scatter(
            x=pred,
            y=meas,
            mode="markers",
            name="steps",
            customdata=both[[STEP.step]].to_numpy(),
            hovertemplate="step %{customdata[0]}<br>pred %{x:.3g}<br>measured %{y:.3g}<extra></extra>",
        )
    )
    fig.add_trace(go.Scatter(x=[-lim, lim], y=[-lim, lim], mode="lines", name="y = x", line=dict(dash="dot")))
    fig.update_xaxes(title_text=LABELS[STEP.dentropy_mean_pred])
    fig.update_yaxes(title_text=LABELS[STEP.dentropy_mean])
    sub = f"{int(fit['n'])} steps, r = {fit['r']:.3f}, slope = {fit['slope']:.3f}"
    return dashboard_layout(fig, f"{title or 'Predicted vs measured ΔH̄'}<br><sup>{sub}</sup>")


def make_entropy_law_figure(df: pd.DataFrame, title: str | None = None, bins: int = 20) -> go.Figure:
    """Measured per-token entropy change against the law of arXiv 2602.03392, -eps p (H + log p), from
    tokengrad.read.entropy_law.entropy_law rows: the tokens (a light scatter) and their means over
    `bins` quantile bins of the prediction, with y = x where the law holds; the pooled fit in the title."""
    if df is None or df.empty:
        return empty_figure(NO_ENTROPY, title)
    x, y = df[LAW_PRED].to_numpy(float), df[TOK.dentropy].to_numpy(float)  # [N], [N]
    fit = law_fit(x, y)
    fig = go.Figure(
        go.Scattergl(
            x=x,
            y=y,
            mode="markers",
            name="tokens",
            marker=dict(size=4, opacity=0.25, color="#999999"),
            customdata=df[[TOK.step, TOK.sample_id, TOK.position, TOK.prob]].to_numpy(),
            hovertemplate="step %{customdata[0]} sample %{customdata[1]} pos %{customdata[2]}<br>"
            "p %{customdata[3]:.3f}<br>law %{x:.3g}<br>measured %{y:.3g}<extra></extra>",
        )
    )
    b = pd.qcut(pd.Series(x).rank(method="first"), min(int(bins), len(x)), labels=False)
    means = pd.DataFrame({"x": x, "y": y, "b": b}).groupby("b")[["x", "y"]].mean()
    fig.add_trace(go.Scatter(x=means["x"], y=means["y"], mode="lines+markers", name=f"mean of {bins} bins"))
    lim = float(max(np.abs(x).max(), np.abs(y).max())) or 1.0
    fig.add_trace(go.Scatter(x=[-lim, lim], y=[-lim, lim], mode="lines", name="y = x", line=dict(dash="dot")))
    fig.update_xaxes(title_text="law: −ε·p·(H + log p), ε = dlogprob / (1 − p) (nats)")
    fig.update_yaxes(title_text=LABELS[TOK.dentropy])
    sub = (
        f"{int(fit['n'])} tokens, Pearson {fit['pearson']:.3f}, Spearman {fit['spearman']:.3f}, "
        f"slope {fit['slope']:.3f}, sign agrees {fit['sign_agree']:.1%}"
    )
    return dashboard_layout(fig, f"{title or 'Entropy law per token (arXiv 2602.03392)'}<br><sup>{sub}</sup>")
