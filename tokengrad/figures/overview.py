"""Per-step training curves: scalar metrics and gradient-norm trajectories of one or more runs.

    figs = make_metric_figure({"grpo": run_a.steps, "tr_grpo": run_b.steps}, "reward_mean")
    make_grad_norm_figure({"grpo": run_a.layers}, smoothing=0.6, log_y=True)

Inputs are the run format's steps/layers tables (tokengrad.runs.Run.steps / .layers) keyed by run name;
every run keeps the colour run_color(name) on every chart. Each curve is drawn raw (faint) and smoothed
with the debiased EMA of smoothing.py; spikes (smoothing.find_spikes) are marked on the raw points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.smoothing import DEFAULT_SPIKE_K, debiased_ema, find_spikes
from tokengrad.figures.style import dashboard_layout, empty_figure, run_colors
from tokengrad.schema import LAYER, STEP, TOTAL_LAYER

OVERVIEW_METRICS = (STEP.reward_mean, STEP.loss, STEP.entropy_mean, STEP.kl, STEP.clip_frac,
                    STEP.weight_mean, STEP.grad_norm)
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
    STEP.time_step: "step time (s)",
}
# Per-step reduction over ranks (and updates): norms take the max as the steps table does, counts add up,
# the rest (means, rates) are averaged.
_REDUCE = {STEP.grad_norm: "max", STEP.n_nonfinite: "sum", STEP.n_tokens: "sum"}


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def step_series(df: pd.DataFrame, column: str, how: str | None = None) -> pd.DataFrame:
    """One row per step: `column` reduced over ranks/updates (max for norms, sum for counts, else mean),
    NaN rows dropped.

    Returns columns [step, column] sorted by step; an absent column gives an empty frame.
    """
    if column not in df.columns or df.empty:
        return pd.DataFrame({STEP.step: pd.Series(dtype="int64"), column: pd.Series(dtype=float)})
    how = how or _REDUCE.get(column, "mean")
    vals = pd.to_numeric(df[column], errors="coerce").astype(float)
    out = vals.groupby(df[STEP.step]).agg(how).dropna()
    return pd.DataFrame({STEP.step: out.index.to_numpy(), column: out.to_numpy()})


def grad_norm_series(layers: pd.DataFrame, layer: str = TOTAL_LAYER) -> pd.DataFrame:
    """Pre-clip gradient norm of one block per step from the layers table: max over updates and ranks.

    The max matches the steps table's grad_norm (the largest norm any update of the step saw).
    """
    if layers.empty or LAYER.layer not in layers.columns:
        return step_series(pd.DataFrame(), LAYER.grad_norm)
    return step_series(layers[layers[LAYER.layer] == layer], LAYER.grad_norm, how="max")


def _add_curve(
    fig: go.Figure,
    x,
    y,
    name: str,
    color: str,
    smoothing: float,
    spike_k: float | None,
    row: int | None = None,
    col: int | None = None,
    showlegend: bool = True,
) -> None:
    """Raw (faint) + smoothed line of one run, plus spike markers; grouped so one legend click hides all."""
    x, y = np.asarray(x), np.asarray(y, dtype=float)
    pos = dict(row=row, col=col) if row else {}
    hover = "step %{x}<br>%{y:.4g}<extra>%{fullData.name}</extra>"
    smoothed = smoothing > 0
    fig.add_trace(
        go.Scatter(
            x=x,
            y=y,
            mode="lines",
            name=f"{name} raw" if smoothed else name,
            legendgroup=name,
            showlegend=showlegend and not smoothed,
            opacity=0.3 if smoothed else 1.0,
            line=dict(color=color, width=1),
            hovertemplate=hover,
        ),
        **pos,
    )
    if smoothed:
        fig.add_trace(
            go.Scatter(
                x=x,
                y=debiased_ema(y, smoothing),
                mode="lines",
                name=name,
                legendgroup=name,
                showlegend=showlegend,
                line=dict(color=color, width=2),
                hovertemplate=hover,
            ),
            **pos,
        )
    if spike_k is not None:
        idx = find_spikes(y, spike_k)
        if idx.size:
            fig.add_trace(
                go.Scatter(
                    x=x[idx],
                    y=y[idx],
                    mode="markers",
                    name=f"{name} spikes",
                    legendgroup=name,
                    showlegend=False,
                    marker=dict(color=color, symbol="x", size=9, line=dict(width=1)),
                    hovertemplate="spike at step %{x}<br>%{y:.4g}<extra>%{fullData.name}</extra>",
                ),
                **pos,
            )


def make_metric_figure(
    steps: Mapping[str, pd.DataFrame],
    metric: str,
    *,
    smoothing: float = 0.6,
    log_y: bool = False,
    spike_k: float | None = None,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """One steps-table metric over steps, one colour per run (raw + debiased EMA; spikes if spike_k)."""
    cmap = run_colors(steps, colors)
    fig = go.Figure()
    for name, df in steps.items():
        s = step_series(df, metric)
        if len(s):
            _add_curve(fig, s[STEP.step], s[metric], name, cmap[name], smoothing, spike_k)
    if not fig.data:
        return empty_figure(f"no '{metric}' values recorded", title)
    fig.update_yaxes(type="log" if log_y else "linear", title=metric_label(metric))
    fig.update_xaxes(title="step")
    return dashboard_layout(fig, title)


def make_overview_figure(
    steps: Mapping[str, pd.DataFrame],
    metrics: Sequence[str] = OVERVIEW_METRICS,
    *,
    smoothing: float = 0.6,
    log_y: bool = False,
    colors: Mapping[str, str] | None = None,
    ncols: int = 2,
    title: str | None = None,
) -> go.Figure:
    """A grid of small multiples, one per metric with any value in any run; metrics with none are left out."""
    present = [m for m in metrics if any(len(step_series(df, m)) for df in steps.values())]
    if not present:
        return empty_figure("no per-step metrics recorded", title)
    nrows = -(-len(present) // ncols)
    fig = make_subplots(
        rows=nrows,
        cols=ncols,
        subplot_titles=[metric_label(m) for m in present],
        horizontal_spacing=0.1,
        vertical_spacing=0.12 if nrows > 1 else 0.0,
    )
    cmap = run_colors(steps, colors)
    for i, metric in enumerate(present):
        row, col = divmod(i, ncols)
        for name, df in steps.items():
            s = step_series(df, metric)
            if len(s):
                _add_curve(
                    fig,
                    s[STEP.step],
                    s[metric],
                    name,
                    cmap[name],
                    smoothing,
                    None,
                    row=row + 1,
                    col=col + 1,
                    showlegend=i == 0,
                )
    fig.update_yaxes(type="log" if log_y else "linear")
    return dashboard_layout(fig, title, height=260 * nrows)


def make_grad_norm_figure(
    layers: Mapping[str, pd.DataFrame],
    *,
    layer: str = TOTAL_LAYER,
    smoothing: float = 0.6,
    log_y: bool = True,
    spike_k: float | None = DEFAULT_SPIKE_K,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Pre-clip gradient norm of `layer` (default the whole model) per step for each run, spikes marked."""
    cmap = run_colors(layers, colors)
    fig = go.Figure()
    for name, df in layers.items():
        s = grad_norm_series(df, layer)
        if len(s):
            _add_curve(fig, s[STEP.step], s[LAYER.grad_norm], name, cmap[name], smoothing, spike_k)
    if not fig.data:
        return empty_figure(f"no gradient norms recorded for '{layer}'", title)
    label = "grad norm (pre-clip)" if layer == TOTAL_LAYER else f"grad norm of {layer}"
    fig.update_yaxes(type="log" if log_y else "linear", title=label)
    fig.update_xaxes(title="step")
    return dashboard_layout(fig, title)


def layer_names(layers: pd.DataFrame) -> list[str]:
    """Block names of the layers table in recorded order, without the total."""
    if layers.empty:
        return []
    names = layers[LAYER.layer].drop_duplicates().tolist()
    return [n for n in names if n != TOTAL_LAYER]


def make_layer_grad_norm_figure(
    layers: pd.DataFrame,
    *,
    names: Sequence[str] | None = None,
    smoothing: float = 0.6,
    log_y: bool = True,
    title: str | None = None,
) -> go.Figure:
    """Per-block gradient-norm trajectories of one run, blocks coloured in depth order (Viridis)."""
    from plotly.colors import sample_colorscale

    names = list(names) if names is not None else layer_names(layers)
    if not names:
        return empty_figure("no per-layer gradient norms recorded", title)
    palette = sample_colorscale("Viridis", [i / max(len(names) - 1, 1) for i in range(len(names))])
    fig = go.Figure()
    for name, color in zip(names, palette):
        s = grad_norm_series(layers, name)
        if len(s):
            _add_curve(fig, s[STEP.step], s[LAYER.grad_norm], name, color, smoothing, None)
    fig.update_yaxes(type="log" if log_y else "linear", title="grad norm (pre-clip)")
    fig.update_xaxes(title="step")
    if len(names) > 8:  # a deep model's blocks: a scrolling legend at the side instead of rows over the title
        return dashboard_layout(
            fig,
            title,
            legend=dict(orientation="v", x=1.02, y=1, yanchor="top", xanchor="left", font=dict(size=10)),
        )
    return dashboard_layout(fig, title)


def make_layer_heatmap_figure(
    layers: pd.DataFrame, *, log_color: bool = True, title: str | None = None
) -> go.Figure:
    """Step x block heatmap of pre-clip gradient norms (log10 colour by default), blocks in recorded order."""
    names = layer_names(layers)
    if not names:
        return empty_figure("no per-layer gradient norms recorded", title)
    series = {n: grad_norm_series(layers, n).set_index(STEP.step)[LAYER.grad_norm] for n in names}
    grid = pd.DataFrame(series).sort_index()  # [steps, blocks]
    z = grid.to_numpy(dtype=float).T  # [blocks, steps]
    shown = np.log10(np.where(z > 0, z, np.nan)) if log_color else z
    fig = go.Figure(
        go.Heatmap(
            x=grid.index.to_numpy(),
            y=names,
            z=shown,
            customdata=z,
            colorscale="Viridis",
            colorbar=dict(title="log10 norm" if log_color else "norm"),
            hovertemplate="step %{x}<br>%{y}<br>grad norm %{customdata:.4g}<extra></extra>",
        )
    )
    fig.update_xaxes(title="step")
    fig.update_yaxes(autorange="reversed")
    return dashboard_layout(fig, title, height=max(300, 22 * len(names) + 120))
