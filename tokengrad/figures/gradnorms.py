"""Gradient-norm trajectories: the whole model per run, and per block of one run (lines and heatmap).

    make_grad_norm_figure({"grpo": run_a.layers, "tr_grpo": run_b.layers}, smoothing=0.6, log_y=True)
    make_layer_grad_norm_figure(run.layers, top_k=5)      # 30+ blocks: the top 5 coloured, the rest grey

Inputs are the run format's layers table keyed by run name. Steps without a gradient (norm 0) are gaps
with a tick at the bottom and a "k of n steps had no gradient" legend entry per run (figures.liveness);
spikes are searched among live steps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from tokengrad.figures.curves import (
    add_curve,
    curve_grid,
    dead_markers,
    finish_curves,
    step_series,
    x_values,
)
from tokengrad.figures.liveness import count_note, dead_steps, live_mask
from tokengrad.figures.smoothing import DEFAULT_SPIKE_K
from tokengrad.figures.style import (
    center_note,
    dashboard_layout,
    empty_figure,
    integer_step_axis,
    readable_log_axis,
    run_colors,
)
from tokengrad.schema import LAYER, STEP, TOTAL_LAYER

OTHER_BLOCKS = "other blocks"
OTHER_COLOR = "#BDBDBD"
DEFAULT_TOP_K = 5


def grad_norm_series(layers: pd.DataFrame, layer: str = TOTAL_LAYER) -> pd.DataFrame:
    """Pre-clip gradient norm of one block per step from the layers table: max over updates and ranks.

    The max matches the steps table's grad_norm (the largest norm any update of the step saw).
    """
    if layers.empty or LAYER.layer not in layers.columns:
        return step_series(pd.DataFrame(), LAYER.grad_norm)
    return step_series(layers[layers[LAYER.layer] == layer], LAYER.grad_norm, how="max")


def run_grad_norms(layers: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """[step, grad_norm] of the whole model: the layers table's total, else the steps table's grad_norm."""
    gn = grad_norm_series(layers)
    if gn.empty and steps is not None:
        gn = step_series(steps, STEP.grad_norm)
    return gn


def make_grad_norm_figure(
    layers: Mapping[str, pd.DataFrame],
    *,
    layer: str = TOTAL_LAYER,
    smoothing: float = 0.6,
    log_y: bool = True,
    spike_k: float | None = DEFAULT_SPIKE_K,
    x_axis: str = "step",
    steps: Mapping[str, pd.DataFrame] | None = None,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Pre-clip gradient norm of `layer` (default the whole model) per step for each run; spikes and
    steps without a gradient marked. `steps` (the runs' steps tables) places the points on a wall-time or
    tokens-seen x axis."""
    cmap = run_colors(layers, colors)
    fig, any_live = curve_grid(), False
    for name, df in layers.items():
        s = grad_norm_series(df, layer)
        if len(s):
            x = x_values((steps or {}).get(name, pd.DataFrame()), x_axis, s[STEP.step])
            add_curve(
                fig,
                x,
                s[LAYER.grad_norm],
                name,
                cmap[name],
                smoothing=smoothing,
                gradient=True,
                spike_k=spike_k,
            )
            any_live = any_live or bool(live_mask(s[LAYER.grad_norm]).any())
    if not fig.data:
        return empty_figure(f"no gradient norms recorded for '{layer}'", title)
    label = "gradient norm before clipping" if layer == TOTAL_LAYER else f"gradient norm of {layer}"
    fig.update_yaxes(type="log" if log_y else "linear", title_text=label, secondary_y=False)
    shown = [y for t in fig.data if t.yaxis in (None, "y") for y in (t.y if t.y is not None else ())]
    if log_y:
        readable_log_axis(fig, shown, secondary_y=False)
    if x_axis == "step":
        integer_step_axis(fig, [x for t in fig.data for x in (t.x if t.x is not None else ())])
    if not any_live:  # only dead-step ticks: no value axis to read
        center_note(fig, "no step had a gradient")
        fig.update_yaxes(type="linear", showticklabels=False, showgrid=False, secondary_y=False)
    fig.update_xaxes(title_text=x_axis)
    return finish_curves(fig, title)


def layer_names(layers: pd.DataFrame) -> list[str]:
    """Block names of the layers table in recorded order, without the total."""
    if layers.empty:
        return []
    names = layers[LAYER.layer].drop_duplicates().tolist()
    return [n for n in names if n != TOTAL_LAYER]


def top_layers(layers: pd.DataFrame, k: int = DEFAULT_TOP_K, names: Sequence[str] | None = None) -> list[str]:
    """The k blocks with the largest median gradient norm over live steps, largest first."""
    names = list(names) if names is not None else layer_names(layers)
    med = {}
    for n in names:
        v = grad_norm_series(layers, n)[LAYER.grad_norm].to_numpy()
        v = v[live_mask(v)]
        med[n] = float(np.median(v)) if v.size else -np.inf
    return sorted(names, key=lambda n: -med[n])[:k]


def make_layer_grad_norm_figure(
    layers: pd.DataFrame,
    *,
    names: Sequence[str] | None = None,
    top_k: int = DEFAULT_TOP_K,
    smoothing: float = 0.6,
    log_y: bool = True,
    title: str | None = None,
) -> go.Figure:
    """Per-block gradient-norm trajectories of one run: the top_k blocks (largest median norm over live
    steps) coloured in depth order (Viridis), the others thin and grey under one legend entry, so a
    model of 30+ blocks stays readable and the legend has at most top_k + 1 entries."""
    names = list(names) if names is not None else layer_names(layers)
    if not names:
        return empty_figure("no per-layer gradient norms recorded", title)
    blocks = layers[layers[LAYER.layer].isin(names)]
    if not live_mask(blocks[LAYER.grad_norm]).any():
        return empty_figure("no step had a gradient: every per-layer norm is 0", title)
    top = set(top_layers(layers, top_k, names))
    shown = [n for n in names if n in top]
    palette = dict(zip(shown, sample_colorscale("Viridis", list(np.linspace(0, 0.9, max(len(shown), 1))))))
    fig = curve_grid()
    first_other = True
    for name in [n for n in names if n not in top] + shown:  # grey under, coloured on top
        s = grad_norm_series(layers, name)
        if s.empty:
            continue
        n_before = len(fig.data)
        add_curve(
            fig,
            s[STEP.step],
            s[LAYER.grad_norm],
            name if name in top else OTHER_BLOCKS,
            palette.get(name, OTHER_COLOR),
            smoothing=smoothing if name in top else 0.0,
            gradient=True,
            mark_dead=False,
            showlegend=name in top or first_other,
        )
        first_other = first_other and name in top
        for t in fig.data[n_before:]:
            t.hovertemplate = f"{name} %{{y:.4g}}" if name not in top else t.hovertemplate
    total = run_grad_norms(layers)
    if dead_steps(total):  # one row of ticks for all blocks: the steps whose total norm is 0
        dead_markers(
            fig,
            dead_steps(total),
            name="all blocks",
            color="#666666",
            note=count_note(total),
            pos=dict(row=1, col=1),
        )
    fig.update_yaxes(
        type="log" if log_y else "linear", title_text="gradient norm before clipping", secondary_y=False
    )
    if log_y:
        readable_log_axis(fig, blocks[LAYER.grad_norm], secondary_y=False)
    fig.update_xaxes(title_text="step")
    integer_step_axis(fig, blocks[STEP.step])
    return finish_curves(fig, title, hovermode="closest")


def make_layer_heatmap_figure(
    layers: pd.DataFrame, *, log_color: bool = True, title: str | None = None
) -> go.Figure:
    """Step x block heatmap of pre-clip gradient norms (log10 colour by default), blocks in recorded
    order; steps without a gradient are blank columns (0 has no logarithm and is not a small norm)."""
    names = layer_names(layers)
    if not names:
        return empty_figure("no per-layer gradient norms recorded", title)
    series = {n: grad_norm_series(layers, n).set_index(STEP.step)[LAYER.grad_norm] for n in names}
    grid = pd.DataFrame(series).sort_index()  # [steps, blocks]
    z = grid.to_numpy(dtype=float).T  # [blocks, steps]
    if not live_mask(z).any():
        return empty_figure("no step had a gradient: every per-layer norm is 0", title)
    shown = np.log10(np.where(z > 0, z, np.nan)) if log_color else np.where(z > 0, z, np.nan)
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
