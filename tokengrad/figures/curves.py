"""Per-step training curves of one or more runs: any steps-table metric against step, wall time or tokens.

    make_metric_figure({"grpo": run_a.steps, "tr_grpo": run_b.steps}, "reward_mean")
    make_overview_figure(steps, metrics=("reward_mean", "kl"), x_axis="tokens seen")

Each curve is drawn raw (faint) and smoothed with the debiased EMA of smoothing.py; hovering shows every
run at that x at once (unified hover) with the smoothed and the recorded value. Steps without a gradient
(figures.liveness) are a gap in gradient curves, marked at the bottom of the panel, and the EMA skips them
instead of decaying through them. The overview's panels share one x zoom.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.liveness import dead_mask, dead_note, live_mask
from tokengrad.figures.smoothing import debiased_ema, find_spikes
from tokengrad.figures.style import (
    add_caption,
    captions,
    dashboard_layout,
    empty_figure,
    integer_step_axis,
    run_colors,
)
from tokengrad.schema import STEP

OVERVIEW_METRICS = (STEP.reward_mean, STEP.loss, STEP.entropy_mean, STEP.kl, STEP.clip_frac, STEP.weight_mean)
METRIC_LABELS = {
    STEP.reward_mean: "reward",
    STEP.loss: "loss",
    STEP.entropy_mean: "entropy (nats)",
    STEP.kl: "KL",
    STEP.clip_frac: "clip fraction",
    STEP.weight_mean: "mean token weight",
    STEP.weight_min: "min token weight",
    STEP.weight_max: "max token weight",
    STEP.grad_norm: "grad norm (pre-clip)",
    STEP.lr: "learning rate",
    STEP.reward_std: "reward std",
    STEP.n_tokens: "loss tokens",
    STEP.n_updates: "updates",
    STEP.n_nonfinite: "non-finite values",
    STEP.time_step: "step time (s)",
    STEP.time_record: "recorder time (s)",
}
GRADIENT_METRICS = frozenset({STEP.grad_norm})  # 0 means "no gradient", never a value on the curve
# Per-step reduction over ranks (and updates): norms and times take the max, counts add up, the rest
# (means, rates) are averaged.
_REDUCE = {STEP.grad_norm: "max", STEP.n_nonfinite: "sum", STEP.n_tokens: "sum", STEP.time_step: "max"}
_KEYS = frozenset({STEP.step, STEP.rank})
DEAD_SYMBOL = "line-ns-open"


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric.replace("_", " "))


def plottable_metrics(steps: Mapping[str, pd.DataFrame]) -> list[str]:
    """Numeric steps-table columns with any value in any run (fixed columns first, then extra ones)."""
    seen: dict[str, None] = {}
    for df in steps.values():
        for c in df.columns:
            if c not in _KEYS and pd.api.types.is_numeric_dtype(df[c]) and df[c].notna().any():
                seen[c] = None
    order = {c: i for i, c in enumerate(METRIC_LABELS)}
    return sorted(seen, key=lambda c: (order.get(c, len(order)), c))


def step_series(df: pd.DataFrame, column: str, how: str | None = None) -> pd.DataFrame:
    """One row per step: `column` reduced over ranks/updates (max for norms and times, sum for counts,
    else mean), NaN rows dropped. Returns [step, column] sorted by step; an absent column gives an empty
    frame."""
    if column not in df.columns or df.empty:
        return pd.DataFrame({STEP.step: pd.Series(dtype="int64"), column: pd.Series(dtype=float)})
    how = how or _REDUCE.get(column, "mean")
    vals = pd.to_numeric(df[column], errors="coerce").astype(float)
    out = vals.groupby(df[STEP.step]).agg(how).dropna()
    return pd.DataFrame({STEP.step: out.index.to_numpy(), column: out.to_numpy()})


def _cumulative(column: str, scale: float) -> Callable[[pd.DataFrame], pd.Series]:
    def x(steps: pd.DataFrame) -> pd.Series:
        s = step_series(steps, column)
        return pd.Series(s[column].cumsum().to_numpy() * scale, index=s[STEP.step].to_numpy())

    return x


def _step_index(steps: pd.DataFrame) -> pd.Series:
    s = np.sort(steps[STEP.step].unique()) if STEP.step in steps.columns else np.array([], dtype=int)
    return pd.Series(s.astype(float), index=s)


# x axis name -> step -> x value, from the run's steps table (wall time: the steps' summed durations).
X_AXES: dict[str, Callable[[pd.DataFrame], pd.Series]] = {
    "step": _step_index,
    "wall time (h)": _cumulative(STEP.time_step, 1 / 3600),
    "tokens seen": _cumulative(STEP.n_tokens, 1.0),
}


def x_values(steps: pd.DataFrame, x_axis: str, at_steps) -> np.ndarray:
    """The x coordinate of each step in `at_steps` on axis `x_axis` (NaN where it is unknown)."""
    if x_axis not in X_AXES:
        raise ValueError(f"unknown x axis {x_axis!r}; known: {list(X_AXES)}")
    at = np.asarray(at_steps)
    if x_axis == "step":
        return at.astype(float)
    return X_AXES[x_axis](steps).reindex(at).to_numpy(dtype=float)


def add_curve(
    fig: go.Figure,
    x,
    y,
    name: str,
    color: str,
    *,
    smoothing: float = 0.0,
    gradient: bool = False,
    mark_dead: bool = True,
    spike_k: float | None = None,
    pos: dict | None = None,
    showlegend: bool = True,
) -> None:
    """Raw (faint) + smoothed line of one run into a curve_grid panel `pos` (row, col); gradient curves
    also get dead-step and spike markers.

    With gradient=True a value of 0 is a step without a gradient: a gap in both lines (the EMA runs over
    live steps only and bridges the gap), a tick at the panel's bottom (unless mark_dead is False, when
    several curves share the ticks), and spikes are searched among live steps. Everything of one run
    shares a legend group so one legend click hides it.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    pos = pos or dict(row=1, col=1)
    dead = dead_mask(y) if gradient else np.zeros(y.size, bool)
    shown = np.where(dead, np.nan, y)
    _add_lines(fig, x, shown, name=name, color=color, smoothing=smoothing, showlegend=showlegend, pos=pos)
    if gradient and mark_dead and dead.any():
        dead_markers(
            fig,
            x[dead],
            name=name,
            color=color,
            note=dead_note(int(dead.sum()), int(np.isfinite(y).sum())),
            pos=pos,
        )
    if spike_k is not None:
        _add_spikes(fig, x, y, name=name, color=color, spike_k=spike_k, pos=pos)


def lone_points(y, connected: bool = False) -> np.ndarray:
    """The finite points a line cannot draw: no finite neighbour to join (a 1-step run, a live step between
    two steps without gradient); with connected (connectgaps) only a curve's one finite point."""
    ok = np.isfinite(np.asarray(y, dtype=float))
    if connected:
        return ok & (ok.sum() == 1)
    return ok & ~np.r_[False, ok[:-1]] & ~np.r_[ok[1:], False]


def _line_mode(y, connected: bool = False) -> dict:
    """mode and markers of a line trace: a dot on each lone point, so that it is drawn at all."""
    lone = lone_points(y, connected)
    if not lone.any():
        return dict(mode="lines")
    return dict(mode="lines+markers", marker=dict(size=np.where(lone, 6, 0)))


def _add_lines(
    fig, x, shown, *, name: str, color: str, smoothing: float, showlegend: bool, pos: dict
) -> None:
    """The recorded line (faint when smoothed) and, with smoothing > 0, its debiased EMA on top; a point
    with no neighbour to join gets a dot."""
    smoothed = smoothing > 0
    fig.add_trace(
        go.Scatter(
            x=x,
            y=shown,
            **_line_mode(shown),
            name=f"{name} raw" if smoothed else name,
            legendgroup=name,
            showlegend=showlegend and not smoothed,
            opacity=0.3 if smoothed else 1.0,
            connectgaps=False,
            line=dict(color=color, width=1),
            hoverinfo="skip" if smoothed else None,
            hovertemplate=None if smoothed else "%{y:.4g}",
        ),
        **pos,
    )
    if not smoothed:
        return
    ema = debiased_ema(shown, smoothing)  # NaN (dead) points are skipped, not decayed through
    fig.add_trace(
        go.Scatter(
            x=x,
            y=ema,
            customdata=shown,
            **_line_mode(ema, connected=True),
            name=name,
            legendgroup=name,
            showlegend=showlegend,
            connectgaps=True,
            line=dict(color=color, width=2),
            hovertemplate="%{y:.4g} (recorded %{customdata:.4g})",
        ),
        **pos,
    )


def _add_spikes(fig, x, y, *, name: str, color: str, spike_k: float, pos: dict) -> None:
    """Markers on the robust-z spikes, searched among live (non-zero) steps only."""
    live = np.flatnonzero(live_mask(y))
    idx = live[find_spikes(y[live], spike_k)]
    if not idx.size:
        return
    fig.add_trace(
        go.Scatter(
            x=x[idx],
            y=y[idx],
            mode="markers",
            name=f"{name} spikes",
            legendgroup=name,
            showlegend=False,
            marker=dict(color=color, symbol="x", size=9, line=dict(width=1)),
            hovertemplate="spike %{y:.4g}",
        ),
        **pos,
    )


NO_GRADIENT = "step without gradient"


def dead_markers(fig: go.Figure, x, *, name: str, color: str, note: str, pos: dict) -> None:
    """Ticks at the bottom of the panel (its hidden 0..1 secondary axis), one per step without a gradient.
    The legend gets one "step without gradient" entry for every run; the count ("k of n steps had no
    gradient") goes to the figure's caption (style.add_caption), which keeps the legend compact."""
    if not any(t.legendgroup == NO_GRADIENT for t in fig.data):  # one legend entry, no data of its own
        fig.add_trace(
            go.Scatter(
                x=[],
                y=[],
                mode="markers",
                name=NO_GRADIENT,
                legendgroup=NO_GRADIENT,
                marker=dict(color="#666666", symbol=DEAD_SYMBOL, size=10, line=dict(width=2)),
            ),
            secondary_y=True,
            **pos,
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=np.full(len(x), 0.03),
            mode="markers",
            name=f"{name}: no gradient",
            legendgroup=NO_GRADIENT,
            showlegend=False,
            marker=dict(color=color, symbol=DEAD_SYMBOL, size=10, line=dict(width=2)),
            hovertemplate=f"{name}: no gradient (grad norm 0)<extra></extra>",
        ),
        secondary_y=True,
        **pos,
    )
    line = f"{name}: {note}"
    if line not in captions(fig):
        add_caption(fig, line)


def curve_grid(nrows: int = 1, ncols: int = 1, titles: Sequence[str] | None = None) -> go.Figure:
    """Subplots for add_curve: each panel has a hidden secondary y axis for the dead-step ticks."""
    return make_subplots(
        rows=nrows,
        cols=ncols,
        specs=[[{"secondary_y": True}] * ncols] * nrows,
        subplot_titles=titles,
        horizontal_spacing=0.1,
        vertical_spacing=0.5 / nrows if nrows > 1 else 0.0,
    )


def make_metric_figure(
    steps: Mapping[str, pd.DataFrame],
    metric: str,
    *,
    smoothing: float = 0.6,
    log_y: bool = False,
    spike_k: float | None = None,
    x_axis: str = "step",
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """One steps-table metric, one colour per run (raw + debiased EMA; spikes if spike_k)."""
    return make_overview_figure(
        steps,
        (metric,),
        smoothing=smoothing,
        log_y=log_y,
        spike_k=spike_k,
        x_axis=x_axis,
        colors=colors,
        ncols=1,
        title=title,
        panel_titles=False,
    )


def make_overview_figure(
    steps: Mapping[str, pd.DataFrame],
    metrics: Sequence[str] = OVERVIEW_METRICS,
    *,
    smoothing: float = 0.6,
    log_y: bool = False,
    spike_k: float | None = None,
    x_axis: str = "step",
    colors: Mapping[str, str] | None = None,
    ncols: int = 2,
    title: str | None = None,
    panel_titles: bool = True,
) -> go.Figure:
    """Small multiples, one per metric with any value in any run (the others are left out), sharing one
    x zoom, with a unified hover over the runs."""
    present = [m for m in metrics if any(len(step_series(df, m)) for df in steps.values())]
    if not present:
        return empty_figure(f"no {'/'.join(metrics) or 'per-step'} values recorded", title)
    ncols = min(ncols, len(present))
    nrows = -(-len(present) // ncols)
    fig = curve_grid(nrows, ncols, [metric_label(m) for m in present] if panel_titles else None)
    cmap = run_colors(steps, colors)
    for i, metric in enumerate(present):
        pos = dict(row=i // ncols + 1, col=i % ncols + 1)
        for name, df in steps.items():
            s = step_series(df, metric)
            if len(s):
                x = x_values(df, x_axis, s[STEP.step])
                add_curve(
                    fig,
                    x,
                    s[metric],
                    name,
                    cmap[name],
                    smoothing=smoothing,
                    gradient=metric in GRADIENT_METRICS,
                    spike_k=spike_k,
                    pos=pos,
                    showlegend=i == 0,
                )
        fig.update_yaxes(
            title_text=metric_label(metric), type="log" if log_y else "linear", secondary_y=False, **pos
        )
        fig.update_xaxes(title_text=x_axis if pos["row"] == nrows else None, **pos)
    if x_axis == "step":
        integer_step_axis(fig, [s for df in steps.values() if STEP.step in df for s in df[STEP.step]])
    return finish_curves(fig, title, height=max(320, 260 * nrows))


def finish_curves(fig: go.Figure, title: str | None, **layout) -> go.Figure:
    """Shared look of every trajectory figure: linked x zoom, unified hover, legend at the side."""
    fig.update_yaxes(secondary_y=True, visible=False, range=[0, 1], fixedrange=True, showgrid=False)
    fig.for_each_xaxis(lambda ax: ax.update(matches="x") if ax.plotly_name != "xaxis" else None)
    layout = {
        "hovermode": "x unified",
        "legend": dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"),
        **layout,
    }
    return dashboard_layout(fig, title, **layout)
