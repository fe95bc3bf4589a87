"""Probability-bucket views (AR-Lopti, arXiv 2505.12929, Fig. 1 and Prop. 4.2) and the rule's weight curve.

    shares = bucket_shares(run.buckets, step_range=(0, 100))
    make_bucket_share_figure(run.buckets)                 # token share vs update share per bucket
    make_grad_vs_prob_figure(grad_norm_by_prob(run))      # with the (1 - p), sqrt2 (1 - p) references

Inputs are the run format's buckets table (one row per step, update, rank and bucket) or the binned
DataFrames of tokengrad.queries.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.style import bucket_colors, dashboard_layout, empty_figure, run_colors
from tokengrad.schema import BIN, BUCKET, RESIDUAL_BUCKET, TOK

_MEAN_COLUMNS = (BUCKET.grad_norm, BUCKET.update_share, BUCKET.cos_to_total, BUCKET.dprob_mean,
                 BUCKET.correct_ratio)
SHARE_COLUMNS = frozenset({BUCKET.token_share, BUCKET.update_share})
BUCKET_LABELS = {
    BUCKET.token_share: "token share", BUCKET.update_share: "update share <g_B, g>/|g|²",
    BUCKET.grad_norm: "bucket gradient norm |g_B|", BUCKET.cos_to_total: "cos(g_B, g)",
    BUCKET.dprob_mean: "mean Δprob after the update", BUCKET.correct_ratio: "correct ratio",
}


def _select_steps(df: pd.DataFrame, step_range: tuple[int, int] | None) -> pd.DataFrame:
    """Rows of the inclusive step range; optional columns that were never written are added as NaN."""
    missing = [c for c in (BUCKET.lo, BUCKET.hi, BUCKET.n_tokens, *_MEAN_COLUMNS) if c not in df.columns]
    df = df.assign(**{c: np.nan for c in missing}) if missing else df
    if step_range is None:
        return df
    lo, hi = step_range
    return df[(df[BUCKET.step] >= lo) & (df[BUCKET.step] <= hi)]


def _ordered(df: pd.DataFrame) -> pd.DataFrame:
    """Probability buckets by lower edge, the residual last."""
    key = df[BUCKET.bucket].eq(RESIDUAL_BUCKET).astype(int)
    return (
        df.assign(_r=key)
        .sort_values(["_r", BUCKET.lo], kind="stable")
        .drop(columns="_r")
        .reset_index(drop=True)
    )


def bucket_shares(buckets: pd.DataFrame, step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per-bucket aggregate over the selected steps (inclusive range).

    n_tokens is summed and token_share recomputed from the counts (sum_B n_B = 1 share over the probability
    buckets); grad_norm, update_share, cos_to_total, dprob_mean and correct_ratio are means over the
    recorded (step, update, rank) rows. Ordered by lower edge, the residual last.
    """
    df = _select_steps(buckets, step_range)
    cols = [BUCKET.bucket, BUCKET.lo, BUCKET.hi, BUCKET.n_tokens, BUCKET.token_share, *_MEAN_COLUMNS]
    if df.empty:
        return pd.DataFrame(columns=cols)
    g = df.groupby(BUCKET.bucket, sort=False)
    out = g[[BUCKET.lo, BUCKET.hi]].first()
    out[BUCKET.n_tokens] = g[BUCKET.n_tokens].sum(min_count=1)
    for c in _MEAN_COLUMNS:
        out[c] = g[c].mean()
    prob = out.index != RESIDUAL_BUCKET
    total = out.loc[prob, BUCKET.n_tokens].sum()
    out[BUCKET.token_share] = np.where(prob, out[BUCKET.n_tokens] / total if total > 0 else np.nan, 0.0)
    return _ordered(out.reset_index())[cols]


def make_bucket_share_figure(
    buckets: pd.DataFrame, step_range: tuple[int, int] | None = None, *, title: str | None = None
) -> go.Figure:
    """Token share vs update share per probability bucket (grouped bars; AR-Lopti Fig. 1 view).

    The update share <g_B, g>/|g|² says how much of the step's update the bucket's tokens made; the
    residual bar is the part of the gradient not built on log pi (e.g. an entropy bonus).
    """
    s = bucket_shares(buckets, step_range)
    if s.empty:
        return empty_figure("no bucket analysis recorded (Recorder bucket_every=0)", title)
    fig = go.Figure()
    for col, color in ((BUCKET.token_share, "#9E9E9E"), (BUCKET.update_share, "#0072B2")):
        fig.add_trace(
            go.Bar(
                x=s[BUCKET.bucket],
                y=s[col],
                name=BUCKET_LABELS[col].split(" <")[0],
                marker_color=color,
                texttemplate="%{y:.0%}",
                textposition="outside",
                hovertemplate="%{x}<br>%{y:.2%}<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="probability bucket")
    fig.update_yaxes(title="share", tickformat=".0%")
    return dashboard_layout(fig, title)


def make_bucket_grad_norm_figure(
    buckets: pd.DataFrame,
    step_range: tuple[int, int] | None = None,
    *,
    total_grad_norm: float | None = None,
    title: str | None = None,
) -> go.Figure:
    """Mean gradient norm of each bucket's tokens alone, |g_B| (AR-Lopti Fig. 1d); optional total line."""
    s = bucket_shares(buckets, step_range)
    s = s[s[BUCKET.bucket] != RESIDUAL_BUCKET]
    if s.empty:
        return empty_figure("no bucket analysis recorded (Recorder bucket_every=0)", title)
    colors = bucket_colors(s[BUCKET.bucket].tolist())
    fig = go.Figure(
        go.Bar(
            x=s[BUCKET.bucket],
            y=s[BUCKET.grad_norm],
            name="|g_B|",
            marker_color=[colors[b] for b in s[BUCKET.bucket]],
            hovertemplate="%{x}<br>|g_B| = %{y:.4g}<extra></extra>",
        )
    )
    if total_grad_norm is not None:
        fig.add_hline(
            y=total_grad_norm, line_dash="dash", annotation_text="all tokens", annotation_position="top right"
        )
    fig.update_xaxes(title="probability bucket")
    fig.update_yaxes(title=BUCKET_LABELS[BUCKET.grad_norm])
    return dashboard_layout(fig, title, showlegend=False)


def bucket_steps(buckets: pd.DataFrame, value: str) -> pd.DataFrame:
    """step x bucket table of `value` (mean over updates and ranks), buckets ordered as bucket_shares."""
    if value not in BUCKET_LABELS:
        raise ValueError(f"unknown bucket value {value!r}; known: {sorted(BUCKET_LABELS)}")
    buckets = _select_steps(buckets, None)
    order = _ordered(buckets.drop_duplicates(BUCKET.bucket))[BUCKET.bucket].tolist()
    grid = buckets.pivot_table(index=BUCKET.step, columns=BUCKET.bucket, values=value, aggfunc="mean")
    return grid.reindex(columns=[b for b in order if b in grid.columns])


def make_bucket_steps_figure(
    buckets: pd.DataFrame,
    value: str = BUCKET.update_share,
    *,
    stacked: bool | None = None,
    title: str | None = None,
) -> go.Figure:
    """A bucket quantity over steps: shares as relative-stacked bars (negative parts stack below 0),
    norms and cosines as lines. `stacked` defaults to True for the share columns."""
    if buckets.empty:
        return empty_figure("no bucket analysis recorded (Recorder bucket_every=0)", title)
    grid = bucket_steps(buckets, value)
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
    fig.update_yaxes(title=BUCKET_LABELS[value], tickformat=".0%" if value in SHARE_COLUMNS else None)
    return dashboard_layout(fig, title)


def make_prob_histogram_figure(
    hist: pd.DataFrame, *, normalize: bool = True, title: str | None = None
) -> go.Figure:
    """Histogram of token probabilities from bins [lo, hi, count] (tokengrad.queries.prob_histogram)."""
    if hist.empty or hist[BIN.count].sum() == 0:
        return empty_figure("no tokens in the selection", title)
    y = hist[BIN.count] / hist[BIN.count].sum() if normalize else hist[BIN.count]
    fig = go.Figure(
        go.Bar(
            x=(hist[BIN.lo] + hist[BIN.hi]) / 2,
            y=y,
            width=hist[BIN.hi] - hist[BIN.lo],
            customdata=hist[[BIN.lo, BIN.hi, BIN.count]],
            marker_color="#0072B2",
            marker_line=dict(width=0.5, color="white"),
            hovertemplate=(
                "p in [%{customdata[0]:.2f}, %{customdata[1]:.2f})<br>"
                "%{customdata[2]} tokens<extra></extra>"
            ),
        )
    )
    fig.update_xaxes(title="token probability p", range=[0, 1])
    fig.update_yaxes(
        title="share of tokens" if normalize else "tokens", tickformat=".0%" if normalize else None
    )
    return dashboard_layout(fig, title, showlegend=False)


def reference_curves(p) -> dict[str, np.ndarray]:
    """The bounds of |d(-log p)/dlogits| = sqrt(1 - 2p + sum_j p_j^2) (AR-Lopti arXiv 2505.12929 Prop. 4.2):

        sqrt(V/(V-1)) (1 - p) <= |p_vec - e_y| <= sqrt(2) (1 - p)

    drawn as (1 - p) (the lower bound for a large vocabulary V) and sqrt(2) (1 - p).
    """
    p = np.asarray(p, dtype=float)
    return {"(1 − p)": 1.0 - p, "√2 (1 − p)": np.sqrt(2.0) * (1.0 - p)}


def make_grad_vs_prob_figure(
    binned: pd.DataFrame,
    value: str = TOK.logit_grad_unit,
    *,
    ref_scale: float = 1.0,
    title: str | None = None,
) -> go.Figure:
    """Mean per-token gradient norm per probability bin against the bin's mean probability, with the
    (1 - p) and sqrt(2)(1 - p) reference curves times `ref_scale`.

    For value=logit_grad_unit the curves bound every token exactly (scale 1). For logit_grad_norm =
    |coef| * unit pass ref_scale = the mean |coef|, which makes the curves a guide, not a bound.
    `binned` has columns lo, hi, count and the token-column means (tokengrad.queries.grad_norm_by_prob).
    """
    if value not in binned.columns:
        raise ValueError(f"binned frame has no column {value!r}; columns: {sorted(binned.columns)}")
    b = binned[(binned[BIN.count] > 0) & binned[value].notna()]
    if b.empty:
        return empty_figure(f"no '{value}' values in the selection", title)
    fig = go.Figure()
    grid = np.linspace(0.0, 1.0, 101)
    for (name, curve), dash in zip(reference_curves(grid).items(), ("dot", "dash")):
        fig.add_trace(
            go.Scatter(
                x=grid,
                y=ref_scale * curve,
                mode="lines",
                name=name,
                line=dict(color="#666", dash=dash, width=1.2),
                hoverinfo="skip",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=b[TOK.prob],
            y=b[value],
            mode="markers+lines",
            name=f"mean {value}",
            marker=dict(color="#D55E00", size=7),
            line=dict(color="#D55E00", width=1),
            customdata=b[[BIN.lo, BIN.hi, BIN.count]],
            hovertemplate="p in [%{customdata[0]:.2f}, %{customdata[1]:.2f}): mean p %{x:.3f}<br>"
            "mean %{y:.4g} over %{customdata[2]} tokens<extra></extra>",
        )
    )
    fig.update_xaxes(title="token probability p", range=[0, 1])
    fig.update_yaxes(title=value.replace("_", " "), rangemode="tozero")
    return dashboard_layout(fig, title)


def make_bucket_dprob_figure(
    buckets: pd.DataFrame, step_range: tuple[int, int] | None = None, *, title: str | None = None
) -> go.Figure:
    """Mean probability change after the update and correct ratio (share of positive-advantage tokens
    whose probability rose) per bucket, side by side (AR-Lopti Fig. 1c and the correct-ratio view)."""
    s = bucket_shares(buckets, step_range)
    s = s[s[BUCKET.bucket] != RESIDUAL_BUCKET]
    if s.empty or s[[BUCKET.dprob_mean, BUCKET.correct_ratio]].isna().all().all():
        return empty_figure("no probability changes recorded (Step.record_prob_change)", title)
    colors = [bucket_colors(s[BUCKET.bucket].tolist())[b] for b in s[BUCKET.bucket]]
    fig = make_subplots(
        rows=1, cols=2, subplot_titles=[BUCKET_LABELS[BUCKET.dprob_mean], BUCKET_LABELS[BUCKET.correct_ratio]]
    )
    for col, c in ((1, BUCKET.dprob_mean), (2, BUCKET.correct_ratio)):
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
