"""Gradient against token probability, from the token table: the AR-Lopti view of which tokens make the
update (arXiv 2505.12929, Fig. 1 and Prop. 4.2), available on every run that recorded tokens.

    shares = gradient_by_bucket(run, step_range=(0, 100))     # tokengrad.read.gradient_shares, live steps
    make_gradient_share_figure(shares)                        # share of tokens vs share of the gradient
    make_grad_vs_prob_figure(grad_norm_by_prob(run))          # with the (1 - p), sqrt2 (1 - p) references

The share of the gradient of a bucket is its sum of per-token logit-gradient norms |coef| |p - e_y| over
the sum for all tokens (and, where the run recorded per-token attribution, its summed update share).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tokengrad.figures.style import dashboard_layout, empty_figure
from tokengrad.schema import BIN, TOK, bucket_label

UPDATE_SHARE = "update_share"
BUCKET_UPDATE = "bucket_update_share"  # the headline share of the update (tokengrad.read.headline)
SHARE_BARS = {  # column -> (legend label, colour): Okabe-Ito grey, blue, vermillion
    "token_share": ("share of loss tokens", "#9E9E9E"),
    "grad_share": ("share of summed per-token gradient norm", "#0072B2"),
    UPDATE_SHARE: ("share of the update (per-token attribution)", "#D55E00"),
    BUCKET_UPDATE: ("share of the update", "#D55E00"),
}


def with_update_shares(shares: pd.DataFrame, pooled: pd.DataFrame | None) -> pd.DataFrame:
    """`shares` (gradient_by_bucket) with the headline update share per bucket (pooled_bucket_shares of
    the bucket analysis) as column bucket_update_share, when both have the same buckets; the per-token
    attribution column is then dropped (one share of the update per chart). attrs["update_from"] says
    which update share the chart shows."""
    out = shares.copy()
    out.attrs = dict(shares.attrs)
    labels = [bucket_label(lo, hi) for lo, hi in zip(shares[BIN.lo], shares[BIN.hi])]
    if pooled is not None and len(pooled):
        got = pooled.set_index("bucket")["update_share"]
        if set(labels) <= set(got.index):
            out[BUCKET_UPDATE] = got.reindex(labels).to_numpy()
            out.attrs["update_from"] = "bucket analysis"
            return out.drop(columns=UPDATE_SHARE, errors="ignore")
    out.attrs["update_from"] = "per-token attribution" if UPDATE_SHARE in out else "none"
    return out


def scope_note(n_live: int, n_steps: int, step_range: tuple[int, int] | None = None) -> str:
    """'11 live of 40 steps (0-39)': which steps a run-wide figure was computed over."""
    where = f" in steps {step_range[0]}-{step_range[1]}" if step_range else ""
    return f"{n_live} live of {n_steps} steps{where}"


def make_gradient_share_figure(shares: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Each probability bucket's share of the loss tokens next to its share of the per-token gradient
    (Σ logit_grad_norm, and Σ update_share where recorded), over the steps `shares` was computed on
    (tokengrad.read.gradient_shares.gradient_by_bucket). Bars are labelled with their percentage; hover adds
    counts."""
    n_steps, n_live = shares.attrs.get("n_steps"), shares.attrs.get("n_live")
    if n_steps and not n_live:
        return empty_figure(f"none of the {n_steps} steps had a gradient (every advantage was 0)", title)
    if shares.empty or shares[BIN.count].sum() == 0:
        return empty_figure("no loss tokens in the selection", title)
    if not np.isfinite(shares["grad_share"]).any():
        return empty_figure("no live step in the selection: every token's gradient is 0", title)
    labels = [bucket_label(lo, hi) for lo, hi in zip(shares[BIN.lo], shares[BIN.hi])]
    fig = go.Figure()
    for col, (name, color) in SHARE_BARS.items():
        if col not in shares.columns or not np.isfinite(shares[col]).any():
            continue
        fig.add_trace(
            go.Bar(
                x=labels,
                y=shares[col],
                name=name,
                marker_color=color,
                texttemplate="%{y:.0%}",
                textposition="outside",
                customdata=np.stack([shares[BIN.count], shares["grad_sum"]], axis=1),
                hovertemplate="p in %{x}<br>%{y:.1%} " + name + "<br>%{customdata[0]} tokens, "
                "summed per-token gradient norm %{customdata[1]:.4g}<extra></extra>",
            )
        )
    fig.update_layout(barmode="group", uniformtext=dict(minsize=8, mode="show"))  # one label size
    fig.update_xaxes(title="token probability bucket")
    top = max(float(np.nanmax(shares[c])) for c in SHARE_BARS if c in shares.columns)
    fig.update_yaxes(title="share", tickformat=".0%", range=[0, min(1.0, top) * 1.15 + 0.02])
    return dashboard_layout(fig, title)


def make_prob_histogram_figure(
    hist: pd.DataFrame, *, normalize: bool = True, title: str | None = None
) -> go.Figure:
    """Histogram of token probabilities from bins [lo, hi, count] (tokengrad.read.queries.prob_histogram)."""
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
                "p in [%{customdata[0]:.2f}, %{customdata[1]:.2f})<br>%{customdata[2]} tokens<extra></extra>"
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


GRAD_WORDS = {
    TOK.logit_grad_unit: "gradient norm per unit coef",
    TOK.logit_grad_norm: "per-token gradient norm",
    TOK.head_grad_norm: "gradient norm at the LM head",
}


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
    `binned` has columns lo, hi, count and the token-column means (tokengrad.read.queries.grad_norm_by_prob).
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
            name="mean per probability bin",
            marker=dict(color="#D55E00", size=7),
            line=dict(color="#D55E00", width=1),
            customdata=b[[BIN.lo, BIN.hi, BIN.count]],
            hovertemplate="p in [%{customdata[0]:.2f}, %{customdata[1]:.2f}): mean p %{x:.3f}<br>"
            "mean %{y:.4g} over %{customdata[2]} tokens<extra></extra>",
        )
    )
    fig.update_xaxes(title="token probability p", range=[0, 1])
    fig.update_yaxes(title=GRAD_WORDS.get(value, value.replace("_", " ")), rangemode="tozero")
    return dashboard_layout(fig, title)


PARTITION_TITLES = {  # share_queries.PARTITIONS -> x-axis title
    "prob": "token probability",
    "entropy_quantile": "entropy quantile (nats)",
    "adv_sign": "advantage sign",
    "position": "token position in the completion",
}
ADV_SIGN = {-1: "A < 0", 0: "A = 0", 1: "A > 0"}


def partition_labels(shares: pd.DataFrame, by: str) -> list[str]:
    """One x label per partition row: the advantage sign, or the [lo, hi) range."""
    if by == "adv_sign":
        return [ADV_SIGN.get(int(lo), str(lo)) for lo in shares[BIN.lo]]
    fmt = (lambda v: f"{v:.0f}") if by == "position" else (lambda v: f"{v:.2f}")
    return [f"{fmt(lo)}-{fmt(hi)}" for lo, hi in zip(shares[BIN.lo], shares[BIN.hi])]


def make_partition_share_figure(shares: pd.DataFrame, by: str, *, title: str | None = None) -> go.Figure:
    """Each part's share of the loss tokens next to its share of the update, Σ update_share per update
    (share_queries.share_by_partition): the exact per-token attribution (arXiv 2505.12929's question, asked of
    any partition: entropy quantile, advantage sign, position or probability)."""
    if by not in PARTITION_TITLES:
        raise ValueError(f"unknown partition {by!r}; known: {list(PARTITION_TITLES)}")
    if shares.empty or shares[BIN.count].sum() == 0:
        return empty_figure("no loss tokens in the selection", title)
    if UPDATE_SHARE not in shares or not np.isfinite(shares[UPDATE_SHARE]).any():
        return empty_figure("no attributed step in the selection (record with attribution=N)", title)
    labels = partition_labels(shares, by)
    fig = go.Figure()
    for col in ("token_share", UPDATE_SHARE):
        name, color = SHARE_BARS[col]
        fig.add_trace(
            go.Bar(
                x=labels,
                y=shares[col],
                name=name,
                marker_color=color,
                texttemplate="%{y:.0%}",
                textposition="outside",
                customdata=shares[BIN.count],
                hovertemplate="%{x}<br>%{y:.1%} " + name + "<br>%{customdata} tokens<extra></extra>",
            )
        )
    fig.update_layout(barmode="group", uniformtext=dict(minsize=8, mode="show"))  # one label size
    fig.update_xaxes(title=PARTITION_TITLES[by], type="category")
    fig.update_yaxes(title="share", tickformat=".0%")
    return dashboard_layout(fig, title)
