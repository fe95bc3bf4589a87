"""The headline chart: which probability bucket makes the update, several runs on one chart (AR-Lopti arXiv
2505.12929 Fig. 1, compared across rules). Shares come from tokengrad.read.headline, the one definition.

    shares = {name: pooled_bucket_shares(run.buckets) for name, run in runs.items()}
    make_headline_figure(shares, colors=run_colors(shares))

Per bucket and run two bars in the run's colour: hatched, the bucket's share of the loss tokens; solid,
its share of the update. A run without a bucket analysis (an empty frame) is named in the subtitle.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tokengrad.figures.style import dashboard_layout, empty_figure, run_colors
from tokengrad.read.headline import TOKEN_SHARE_NAME, UPDATE_SHARE_NAME
from tokengrad.schema import BUCKET, RESIDUAL_BUCKET

RESIDUAL_TOL = 5e-4  # a residual share below this rounds to 0 % and is not drawn
Y_TITLE = "share"
KEY_COLOR = "#666666"


def _shown(s: pd.DataFrame) -> pd.DataFrame:
    res = s[BUCKET.bucket] == RESIDUAL_BUCKET
    return s[~res | (s[BUCKET.update_share].abs() >= RESIDUAL_TOL)]


def make_headline_figure(
    shares: Mapping[str, pd.DataFrame],
    *,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Token share (hatched) and update share (solid) per probability bucket for each run, overlaid as
    grouped bars; each update bar is labelled with its percentage (hidden where it would not fit)."""
    have = {n: _shown(s) for n, s in shares.items() if len(s)}
    missing = [n for n, s in shares.items() if not len(s)]
    if not have:
        why = "no bucket analysis with a gradient in " + ", ".join(missing) if missing else "no runs"
        return empty_figure(why, title)
    cmap = run_colors(list(shares), colors)
    order = list(dict.fromkeys(b for s in have.values() for b in s[BUCKET.bucket]))
    fig = go.Figure()
    for name, s in have.items():
        _add_run_bars(fig, name, s.set_index(BUCKET.bucket).reindex(order), order, cmap[name])
    _add_fill_keys(fig)
    top = max(
        float(np.nanmax(s[[BUCKET.token_share, BUCKET.update_share]].to_numpy(float))) for s in have.values()
    )
    fig.update_layout(
        barmode="group", bargap=0.25, bargroupgap=0.05, uniformtext=dict(minsize=8, mode="hide")
    )
    fig.update_xaxes(title="token probability bucket", type="category")
    fig.update_yaxes(
        title=Y_TITLE, tickformat=".0%", range=[min(0.0, _bottom(have)), min(1.0, top) * 1.15 + 0.03]
    )
    if missing:
        title = f"{title or ''}<br><sup>no bucket analysis in {', '.join(missing)}</sup>"
    return dashboard_layout(fig, title)


def _bottom(have: Mapping[str, pd.DataFrame]) -> float:
    low = min(float(np.nanmin(s[BUCKET.update_share].to_numpy(float))) for s in have.values())
    return low * 1.15 if low < 0 else 0.0


def _add_run_bars(fig: go.Figure, name: str, s: pd.DataFrame, order: list[str], color: str) -> None:
    """One run's two bars per bucket: hatched token share, solid update share labelled with its percentage."""
    n_tokens = s[BUCKET.n_tokens].fillna(0).to_numpy()
    for col, hatched in ((BUCKET.token_share, True), (BUCKET.update_share, False)):
        label = TOKEN_SHARE_NAME if hatched else UPDATE_SHARE_NAME
        y = s[col].to_numpy(dtype=float)
        fig.add_trace(
            go.Bar(
                x=order,
                y=np.where(np.isfinite(y), y, 0.0),
                name=name,
                legendgroup=name,
                showlegend=not hatched,
                marker=dict(
                    color="white" if hatched else color,
                    line=dict(color=color, width=1.2),
                    pattern=dict(shape="/", fgcolor=color, size=5) if hatched else None,
                ),
                text=None if hatched else [f"{v:.0%}" if np.isfinite(v) else "" for v in y],
                textposition="outside",
                cliponaxis=False,
                customdata=n_tokens,
                hovertemplate=f"{name}<br>%{{x}}: %{{y:.1%}} {label}<br>%{{customdata}} loss tokens"
                "<extra></extra>",
            )
        )


def _add_fill_keys(fig: go.Figure) -> None:
    """Legend keys of the two fills (a scatter: an empty bar would take a slot in each group)."""
    for label, symbol in ((TOKEN_SHARE_NAME, "square-open"), (UPDATE_SHARE_NAME, "square")):
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=f"{'hatched' if symbol.endswith('open') else 'solid'}: {label}",
                marker=dict(color=KEY_COLOR, symbol=symbol, size=11, line=dict(width=1.5, color=KEY_COLOR)),
                hoverinfo="skip",
            )
        )
