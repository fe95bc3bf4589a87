"""What-if figures: the actual pre-clip gradient norm beside the norm each other weighting rule would have
produced from the same parameters on the same batch (the `whatif` table), spike steps of the actual update
marked; the rules' probability-bucket shares beside the actual ones; the cosine of each rule's update to the
actual one. Pure Plotly over the frames of tokengrad.read.whatif_frames.

    make_whatif_norm_figure(norm_trajectories(run.table("whatif"), run.layers))
    make_whatif_share_figure(bucket_share_table(run.table("whatif"), run.buckets))
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tokengrad.figures.smoothing import DEFAULT_SPIKE_K, find_spikes
from tokengrad.figures.style import (
    add_caption,
    bucket_color,
    dashboard_layout,
    empty_figure,
    integer_step_axis,
    run_colors,
)
from tokengrad.read.whatif_frames import ACTUAL

NO_WHATIF = "no what-if rows: record them with WhatIf(rules=[...], every=N) or the config key whatif"


def series_colors(series) -> dict[str, str]:
    """The actual update in black, each rule in its own palette colour (stable for the rule's label)."""
    rules = [s for s in dict.fromkeys(series) if s != ACTUAL]
    return {ACTUAL: "#222222", **run_colors(rules)}


def spike_steps(norms: pd.DataFrame, k: float = DEFAULT_SPIKE_K) -> list[int]:
    """Steps whose actual norm is a robust-z spike among the analysed steps (figures.smoothing)."""
    actual = norms[norms.series == ACTUAL].sort_values("step")
    idx = find_spikes(actual.grad_norm.to_numpy(dtype=float), k)
    return [int(s) for s in actual.step.to_numpy()[idx]]


def _lines(frame: pd.DataFrame, column: str, colors: dict[str, str]) -> go.Figure:
    """One line per series of `column` against step, the actual update drawn heavier."""
    fig = go.Figure()
    for name, df in frame.groupby("series", sort=False):
        width = 2.5 if name == ACTUAL else 1.5
        fig.add_trace(
            go.Scatter(
                x=df.step,
                y=df[column],
                name=name,
                mode="lines+markers",
                line=dict(color=colors[name], width=width),
            )
        )
    return fig


def make_whatif_norm_figure(norms: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Pre-clip gradient norm per analysed step: the actual update and each rule on the same states;
    spike steps of the actual update are marked with a ring."""
    if norms.empty:
        return empty_figure(NO_WHATIF, title)
    fig = _lines(norms, "grad_norm", series_colors(norms.series))
    spikes = spike_steps(norms)
    if spikes:
        hit = norms[(norms.series == ACTUAL) & norms.step.isin(spikes)]
        fig.add_trace(
            go.Scatter(
                x=hit.step,
                y=hit.grad_norm,
                name="spike (actual)",
                mode="markers",
                marker=dict(symbol="circle-open", size=16, color="#d62728", line=dict(width=2)),
            )
        )
    integer_step_axis(fig, norms.step)
    fig.update_layout(xaxis_title="step", yaxis_title="gradient norm before clipping")
    add_caption(fig, "each rule's update from the same parameters on the same batch as the actual one")
    return dashboard_layout(fig, title or "Actual vs what-if gradient norm")


def make_whatif_share_figure(shares: pd.DataFrame, title: str | None = None) -> go.Figure:
    """Mean share of the update per probability bucket, one bar group per series (actual and each rule)."""
    if shares.empty:
        return empty_figure(NO_WHATIF + ", with buckets", title)
    fig = go.Figure()
    for bucket, df in shares.groupby("bucket", sort=False):
        fig.add_trace(
            go.Bar(
                x=df.series,
                y=df.update_share,
                name=str(bucket),
                marker_color=bucket_color(str(bucket)),
                text=[f"{v:.0%}" if np.isfinite(v) else "" for v in df.update_share.astype(float)],
            )
        )
    fig.update_layout(
        barmode="stack", xaxis_title="", yaxis_title="share of the update", yaxis_tickformat=".0%"
    )
    n = int(shares.n_steps.max())
    add_caption(fig, f"mean over {n} analysed step{'s' if n != 1 else ''}; <g_B, g>/|g|^2 of each update")
    return dashboard_layout(fig, title or "Update share by probability bucket: actual vs what-if")


def make_whatif_cos_figure(norms: pd.DataFrame, title: str | None = None) -> go.Figure:
    """cos(g_R, g) per analysed step for each rule: 1 = the same direction as the actual update."""
    rules = norms[norms.series != ACTUAL]
    if rules.empty:
        return empty_figure(NO_WHATIF, title)
    fig = _lines(rules, "cos_to_actual", series_colors(norms.series))
    integer_step_axis(fig, rules.step)
    fig.update_layout(xaxis_title="step", yaxis_title="cosine to the actual update")
    return dashboard_layout(fig, title or "Direction of each rule's update")
