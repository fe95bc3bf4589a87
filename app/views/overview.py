"""Overview: per-step training curves and gradient-norm trajectories of the picked runs, overlaid."""

from __future__ import annotations

import streamlit as st

from app import data
from app.views import common
from tokengrad.figures.overview import (
    layer_names,
    make_grad_norm_figure,
    make_layer_grad_norm_figure,
    make_layer_heatmap_figure,
    make_overview_figure,
)
from tokengrad.figures.smoothing import DEFAULT_SPIKE_K
from tokengrad.figures.summary import summarize_run
from tokengrad.schema import LAYER

NO_STEPS = "Record step scalars with `st.log(loss=..., reward_mean=..., kl=...)` in each `rec.step()`."
NO_LAYERS = ("Record gradient norms with `st.record_grad_norms()` after the last backward of each update "
             "(tokengrad's trainer does this).")


def _controls() -> tuple[float, bool, float]:
    c1, c2, c3 = st.columns([3, 1, 1])
    smoothing = c1.slider("Smoothing (debiased EMA weight)", 0.0, 0.99, 0.6, 0.01, key="ov_smooth",
                          help="TensorBoard-style smoothing; 0 shows the raw curves only.")
    log_y = c2.toggle("log-y gradient norms", value=True, key="ov_logy")
    spike_k = c3.number_input(
        "spike threshold (robust z)",
        1.0,
        20.0,
        DEFAULT_SPIKE_K,
        0.5,
        key="ov_k",
        help="A step is a spike when its gradient norm's modified z-score exceeds this.",
    )
    return smoothing, log_y, spike_k


def _summary(runs: list[str], spike_k: float) -> None:
    rows = [
        summarize_run(
            common.run_name(r),
            data.meta(r),
            data.table(r, "steps"),
            data.table(r, "layers"),
            data.table(r, "evals"),
            spike_k,
        )
        for r in runs
    ]
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_config={
            "final_reward": st.column_config.NumberColumn("final reward", format="%.3f"),
            "eval_accuracy": st.column_config.NumberColumn("eval accuracy", format="%.3f"),
            "grad_norm_cv": st.column_config.NumberColumn("grad-norm CV", format="%.3f"),
        },
    )


def _curves(runs: list[str], smoothing: float) -> None:
    steps = {common.run_name(r): data.table(r, "steps") for r in runs}
    if all(df.empty for df in steps.values()):
        common.empty("No steps table in the picked runs.", NO_STEPS)
        return
    common.chart(
        make_overview_figure(steps, smoothing=smoothing, colors=common.colors()),
        "ov_metrics",
        "training_curves",
    )


def _grad_norms(runs: list[str], smoothing: float, log_y: bool, spike_k: float) -> None:
    layers = {common.run_name(r): data.table(r, "layers") for r in runs}
    missing = [name for name, df in layers.items() if df.empty]
    if missing:
        common.empty(f"No gradient norms (layers table) in: {', '.join(missing)}.", NO_LAYERS)
    layers = {k: v for k, v in layers.items() if not v.empty}
    if not layers:
        return
    if not any((df[LAYER.grad_norm] > 0).any() for df in layers.values()):
        common.empty(
            "Every recorded gradient norm is 0.",
            "All advantages were 0: each group's completions got "
            "the same reward (e.g. a model that solves none of the prompts). Nothing to plot on a log axis.",
        )
        return
    fig = make_grad_norm_figure(
        layers,
        smoothing=smoothing,
        log_y=log_y,
        spike_k=spike_k,
        colors=common.colors(),
        title="Total gradient norm before clipping",
    )
    common.chart(fig, "ov_gradnorm", "grad_norm_total")
    run = common.pick_one([r for r in runs if common.run_name(r) in layers], "ov_layer_run", "Per-layer run")
    df = layers[common.run_name(run)]
    if not layer_names(df):
        common.empty("This run recorded only the total gradient norm.", NO_LAYERS)
        return
    common.chart(
        make_layer_grad_norm_figure(
            df, smoothing=smoothing, log_y=log_y, title=f"Per-layer gradient norms: {common.run_name(run)}"
        ),
        "ov_layers",
        f"grad_norm_layers_{common.run_name(run)}",
    )
    common.chart(
        make_layer_heatmap_figure(df, title="Step x layer gradient norm"),
        "ov_heat",
        f"grad_norm_heatmap_{common.run_name(run)}",
    )


def render() -> None:
    st.title("Overview")
    runs = common.require_runs()
    smoothing, log_y, spike_k = _controls()
    with common.guard("Run summary"):
        _summary(runs, spike_k)
    with common.guard("Training curves"):
        _curves(runs, smoothing)
    st.subheader("Gradient norms")
    with common.guard("Gradient norms"):
        _grad_norms(runs, smoothing, log_y, spike_k)
    common.show_run_warnings(runs)


render()
