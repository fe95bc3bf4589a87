"""Probability-bucket analysis (AR-Lopti, arXiv 2505.12929, Fig. 1) from the buckets table, and the rule's
weight curve.

    shares = bucket_shares(run.buckets, step_range=(0, 100), update_id=None)
    make_bucket_share_figure(run.buckets)                 # token share vs update share per bucket
    make_bucket_grad_norm_figure(run.buckets)             # |g_B| of each bucket's tokens alone

The buckets table has one row per analysed (step, update, rank) and bucket. Only analysed updates with a
gradient count (tokengrad.figures.bucket_updates), and the token shares, update shares and norms all
come from the same updates (one Lopti phase, or all of them), so the figures on a page agree. The figures
say which updates and how many contributed (analysis_note), and an empty selection says why it is empty.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.bucket_updates import analysed_updates, analysis_note, live_rows, live_step_rows
from tokengrad.figures.style import (
    bucket_colors,
    dashboard_layout,
    empty_figure,
    integer_step_axis,
    run_colors,
)
from tokengrad.read.headline import pooled_bucket_shares, pooled_step_shares
from tokengrad.schema import BUCKET, RESIDUAL_BUCKET

_MEAN_COLUMNS = (
    BUCKET.grad_norm,
    BUCKET.update_share,
    BUCKET.cos_to_total,
    BUCKET.dprob_mean,
    BUCKET.correct_ratio,
)
AFTER_STEP = (BUCKET.dprob_mean, BUCKET.correct_ratio)  # measured after the step, on its last update's rows
SHARE_COLUMNS = frozenset({BUCKET.token_share, BUCKET.update_share})
BUCKET_LABELS = {  # the columns in words, on axes, legends and pickers
    BUCKET.token_share: "share of loss tokens",
    BUCKET.update_share: "share of the update",
    BUCKET.grad_norm: "gradient norm of the bucket's tokens",
    BUCKET.cos_to_total: "cosine to the update",
    BUCKET.dprob_mean: "mean change of probability",
    BUCKET.correct_ratio: "share of A > 0 tokens made more likely",
}
RESIDUAL_HELP = (
    "residual: the part of the update not built on log π (an entropy bonus or a KL term "
    "on other tokens); hidden when it is 0"
)
RESIDUAL_TOL = 5e-4  # |mean residual share| below this rounds to 0.0% and is hidden


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    """Probability buckets by lower edge, the residual last."""
    key = df[BUCKET.bucket].eq(RESIDUAL_BUCKET).astype(int)
    return (
        df.assign(_r=key)
        .sort_values(["_r", BUCKET.lo], kind="stable")
        .drop(columns="_r")
        .reset_index(drop=True)
    )


def bucket_shares(
    buckets: pd.DataFrame, step_range: tuple[int, int] | None = None, update_id: int | None = None
) -> pd.DataFrame:
    """Per-bucket aggregate over the analysed updates with a gradient in the selection.

    n_tokens, token_share and update_share are pooled over the updates as the headline defines them
    (tokengrad.read.headline: sum_u <g_B,u, g_u> / sum_u |g_u|^2, so a Lopti step's phases combine into
    its update and all buckets sum to 1); cos_to_total is the mean over them, dprob_mean and correct_ratio
    (measured once a step, after its last update) the means over the steps with a gradient;
    grad_norm is the mean over the updates where the bucket had tokens (a bucket without tokens has
    g_B = 0 by construction, which would dilute the mean). Ordered by lower edge, the residual last;
    attrs["note"] is analysis_note of the selection.
    """
    cols = [BUCKET.bucket, BUCKET.lo, BUCKET.hi, BUCKET.n_tokens, BUCKET.token_share, *_MEAN_COLUMNS]
    df = live_rows(buckets, step_range, update_id)
    note = analysis_note(analysed_updates(buckets, step_range, update_id))
    if df.empty:
        out = pd.DataFrame(columns=cols)
        out.attrs["note"] = note
        return out
    g = df.groupby(BUCKET.bucket, sort=False)
    out = g[[BUCKET.lo, BUCKET.hi]].first()
    for c in _MEAN_COLUMNS:
        out[c] = g[c].mean()
    after = live_step_rows(buckets, step_range, update_id).groupby(BUCKET.bucket)
    for c in AFTER_STEP:
        out[c] = after[c].mean()
    with_tokens = df[df[BUCKET.n_tokens].fillna(0) > 0]
    out[BUCKET.grad_norm] = with_tokens.groupby(BUCKET.bucket)[BUCKET.grad_norm].mean()
    # token and update shares pooled over the updates (the headline definition, tokengrad.read.headline)
    pooled = pooled_bucket_shares(buckets, step_range, update_id).set_index(BUCKET.bucket)
    for c in (BUCKET.n_tokens, BUCKET.token_share, BUCKET.update_share):
        out[c] = pooled[c].reindex(out.index)
    out[BUCKET.token_share] = out[BUCKET.token_share].fillna(0.0)
    out = _ordered(out.reset_index())[cols]
    out.attrs["note"] = note
    return out


def _shown(s: pd.DataFrame) -> pd.DataFrame:
    """Probability buckets, plus the residual only when its update share is not 0."""
    res = s[BUCKET.bucket] == RESIDUAL_BUCKET
    keep = ~res | (s[BUCKET.update_share].abs() >= RESIDUAL_TOL)
    return s[keep.fillna(False)]


def make_bucket_share_figure(
    buckets: pd.DataFrame,
    step_range: tuple[int, int] | None = None,
    *,
    update_id: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Token share vs update share per probability bucket (grouped bars; AR-Lopti Fig. 1 view), from the
    same analysed updates with a gradient; the subtitle says which.

    The update share <g_B, g>/|g|² says how much of the update the bucket's tokens made; the residual bar
    (shown when not 0) is the part of the gradient not built on log pi (e.g. an entropy bonus).
    """
    s = bucket_shares(buckets, step_range, update_id)
    note = s.attrs["note"]
    if s.empty:
        return empty_figure(note, title)
    s = _shown(s)
    fig = go.Figure()
    for col, color in ((BUCKET.token_share, "#9E9E9E"), (BUCKET.update_share, "#0072B2")):
        fig.add_trace(
            go.Bar(
                x=s[BUCKET.bucket],
                y=s[col].fillna(0.0),
                name=BUCKET_LABELS[col],
                marker_color=color,
                texttemplate="%{y:.0%}",
                textposition="outside",
                customdata=s[BUCKET.n_tokens].fillna(0),
                hovertemplate="%{x}<br>%{y:.2%} (%{customdata} tokens)<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(barmode="group", uniformtext=dict(minsize=8, mode="show"))  # one label size
    fig.update_xaxes(title="token probability bucket")
    fig.update_yaxes(title="share", tickformat=".0%")
    return dashboard_layout(fig, _with_note(title, note))


def _with_note(title: str | None, note: str) -> str:
    return f"{title}<br><sup>{note}</sup>" if title else note


def make_bucket_grad_norm_figure(
    buckets: pd.DataFrame,
    step_range: tuple[int, int] | None = None,
    *,
    update_id: int | None = None,
    total_grad_norm: float | None = None,
    title: str | None = None,
) -> go.Figure:
    """Mean gradient norm of each bucket's tokens alone, |g_B| (AR-Lopti Fig. 1d), over the analysed
    updates with a gradient where the bucket had tokens; optional total line."""
    s = bucket_shares(buckets, step_range, update_id)
    note = s.attrs["note"]
    s = s[(s[BUCKET.bucket] != RESIDUAL_BUCKET) & s[BUCKET.grad_norm].notna()]
    if s.empty:
        return empty_figure(note, title)
    colors = bucket_colors(s[BUCKET.bucket].tolist())
    fig = go.Figure(
        go.Bar(
            x=s[BUCKET.bucket],
            y=s[BUCKET.grad_norm],
            name="|g_B|",
            marker_color=[colors[b] for b in s[BUCKET.bucket]],
            customdata=s[BUCKET.n_tokens],
            hovertemplate="%{x}<br>|g_B| = %{y:.4g} (%{customdata} tokens)<extra></extra>",
        )
    )
    if total_grad_norm is not None:
        fig.add_hline(
            y=total_grad_norm, line_dash="dash", annotation_text="all tokens", annotation_position="top right"
        )
    fig.update_xaxes(title="probability bucket")
    fig.update_yaxes(title=BUCKET_LABELS[BUCKET.grad_norm])
    return dashboard_layout(fig, _with_note(title, note), showlegend=False)


def bucket_steps(buckets: pd.DataFrame, value: str, update_id: int | None = None) -> pd.DataFrame:
    """step x bucket table of `value` over the step's live analysed updates, buckets ordered as
    bucket_shares; the residual column only when it is not 0. Shares are pooled over the step's updates
    (tokengrad.read.headline.pooled_step_shares: with update_id=None a Lopti step shows its combined
    update, summing to 1), the other values are means over updates and ranks."""
    if value not in BUCKET_LABELS:
        raise ValueError(f"unknown bucket value {value!r}; known: {sorted(BUCKET_LABELS)}")
    rows = live_rows(buckets, None, update_id)
    if rows.empty:
        return pd.DataFrame()
    order = _ordered(rows.drop_duplicates(BUCKET.bucket))[BUCKET.bucket].tolist()
    if value in SHARE_COLUMNS:
        grid = pooled_step_shares(buckets, value, update_id)
    else:
        src = live_step_rows(buckets, None, update_id) if value in AFTER_STEP else rows
        grid = src.pivot_table(index=BUCKET.step, columns=BUCKET.bucket, values=value, aggfunc="mean")
    if RESIDUAL_BUCKET in grid.columns and not (grid[RESIDUAL_BUCKET].abs() >= RESIDUAL_TOL).any():
        grid = grid.drop(columns=RESIDUAL_BUCKET)
    return grid.reindex(columns=[b for b in order if b in grid.columns])


def make_bucket_steps_figure(
    buckets: pd.DataFrame,
    value: str = BUCKET.update_share,
    *,
    update_id: int | None = None,
    stacked: bool | None = None,
    title: str | None = None,
) -> go.Figure:
    """A bucket quantity over the live analysed steps: shares as relative-stacked bars (negative parts
    stack below 0), norms and cosines as lines. `stacked` defaults to True for the share columns."""
    grid = bucket_steps(buckets, value, update_id) if not buckets.empty else pd.DataFrame()
    if grid.empty or grid.isna().all().all():
        return empty_figure(analysis_note(analysed_updates(buckets, None, update_id)), title)
    stacked = value in SHARE_COLUMNS if stacked is None else stacked
    colors = bucket_colors(list(grid.columns))
    fig = go.Figure()
    for b in grid.columns:
        hover = f"step %{{x}}<br>{b}: %{{y:.4g}}<extra></extra>"
        trace = go.Bar if stacked else go.Scatter
        style = dict(marker_color=colors[b]) if stacked else dict(mode="lines+markers", line_color=colors[b])
        fig.add_trace(
            trace(x=grid.index.to_numpy(), y=grid[b].to_numpy(), name=b, hovertemplate=hover, **style)
        )
    if stacked:
        fig.update_layout(barmode="relative", bargap=0.05)
    fig.update_xaxes(title="step")
    integer_step_axis(fig, grid.index.to_numpy())
    fig.update_yaxes(title=BUCKET_LABELS[value], tickformat=".0%" if value in SHARE_COLUMNS else None)
    return dashboard_layout(fig, title)


def make_bucket_dprob_figure(
    buckets: pd.DataFrame,
    step_range: tuple[int, int] | None = None,
    *,
    update_id: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Mean probability change after the update and correct ratio (share of positive-advantage tokens
    whose probability rose) per bucket, side by side (AR-Lopti Fig. 1c and the correct-ratio view), over
    the analysed updates with a gradient."""
    s = bucket_shares(buckets, step_range, update_id)
    note = s.attrs["note"]
    s = s[s[BUCKET.bucket] != RESIDUAL_BUCKET]
    if s.empty:
        return empty_figure(note, title)
    if s[[BUCKET.dprob_mean, BUCKET.correct_ratio]].isna().all().all():
        return empty_figure("no probability changes recorded (Step.record_prob_change)", title)
    colors = [bucket_colors(s[BUCKET.bucket].tolist())[b] for b in s[BUCKET.bucket]]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=[BUCKET_LABELS[BUCKET.dprob_mean], BUCKET_LABELS[BUCKET.correct_ratio]]
    )
    for col, c in ((1, BUCKET.dprob_mean), (2, BUCKET.correct_ratio)):
        if s[c].isna().all():
            continue
        fig.add_trace(
            go.Bar(
                x=s[BUCKET.bucket],
                y=s[c],
                name=BUCKET_LABELS[c],
                marker_color=colors,
                hovertemplate="%{x}<br>%{y:.4g}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.add_hline(y=0.5, line_dash="dash", line_color="#666", row=1, col=2)
    fig.update_xaxes(title="probability bucket")
    return dashboard_layout(fig, title, showlegend=False)


def weight_curve(meta: dict) -> pd.DataFrame | None:
    """The rule's w(p) from meta["weighting"]["curve"] = {"p": [...], "w": [...]}, or None if absent."""
    curve = ((meta or {}).get("weighting") or {}).get("curve")
    if not curve:
        return None
    p, w = curve.get("p"), curve.get("w")
    if p is None or w is None or len(p) != len(w):
        raise ValueError(
            f"meta weighting curve needs equal-length 'p' and 'w' lists, got keys {sorted(curve)}"
        )
    return pd.DataFrame({"p": np.asarray(p, dtype=float), "w": np.asarray(w, dtype=float)})


def make_weight_curve_figure(
    metas: Mapping[str, dict], *, colors: Mapping[str, str] | None = None, title: str | None = None
) -> go.Figure:
    """Token weight w(p) of each run's weighting rule, with w = 1 (unweighted GRPO) dashed."""
    cmap = run_colors(metas, colors)
    fig = go.Figure()
    for name, meta in metas.items():
        curve = weight_curve(meta)
        if curve is not None:
            rule = (meta.get("weighting") or {}).get("name", "")
            fig.add_trace(
                go.Scatter(
                    x=curve["p"],
                    y=curve["w"],
                    mode="lines",
                    name=name,
                    line=dict(color=cmap[name], width=2),
                    hovertemplate=f"{rule}<br>p %{{x:.3f}}<br>w %{{y:.4g}}<extra>{name}</extra>",
                )
            )
    if not fig.data:
        return empty_figure("no weight curve in the runs' meta", title)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#999")
    fig.update_xaxes(title="token probability p", range=[0, 1])
    fig.update_yaxes(title="token weight w(p)")
    return dashboard_layout(fig, title)
