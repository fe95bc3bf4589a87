"""Overview: per-step training curves and gradient-norm trajectories of the picked runs, overlaid."""

from __future__ import annotations

import streamlit as st

from app import data
from app.views import common, urlstate
from tokengrad.figures.curves import (
    OVERVIEW_METRICS,
    X_AXES,
    make_overview_figure,
    metric_label,
    plottable_metrics,
)
from tokengrad.figures.gradnorms import (
    DEFAULT_TOP_K,
    layer_names,
    make_grad_norm_figure,
    make_layer_grad_norm_figure,
    make_layer_heatmap_figure,
    run_grad_norms,
)
from tokengrad.figures.liveness import LIVE_HELP, count_note
from tokengrad.figures.smoothing import DEFAULT_SPIKE_K
from tokengrad.figures.summary import summarize_run
from tokengrad.schema import STEP

NO_STEPS = "Record step scalars with `st.log(loss=..., reward_mean=..., kl=...)` in each `rec.step()`."
NO_LAYERS = (
    "Record gradient norms with `st.record_grad_norms()` after the last backward of each update "
    "(tokengrad's trainer does this)."
)


def _controls() -> dict:
    urlstate.default("ov_smooth", 0.6)
    urlstate.default("ov_logy", True)
    urlstate.default("ov_x", "step")
    c1, c2, c3, c4 = st.columns([3, 2, 1, 1])
    smoothing = c1.slider(
        "Smoothing (debiased EMA weight)",
        0.0,
        0.99,
        step=0.01,
        key="ov_smooth",
        help="TensorBoard-style smoothing over live steps; 0 shows the raw curves only.",
    )
    x_axis = c2.radio("x axis", list(X_AXES), horizontal=True, key="ov_x")
    log_y = c3.toggle("log-y gradient norms", key="ov_logy")
    spike_k = c4.number_input(
        "spike threshold (robust z)",
        1.0,
        20.0,
        DEFAULT_SPIKE_K,
        0.5,
        key="ov_k",
        help="A live step is a spike when its gradient norm's modified z-score (median and MAD of the "
        "live steps) exceeds this.",
    )
    return dict(
        smoothing=smoothing, x_axis=x_axis if x_axis in X_AXES else "step", log_y=log_y, spike_k=spike_k
    )


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
            "no_gradient": st.column_config.TextColumn(
                "steps without gradient", help="Steps whose gradient norm is 0: every advantage was 0."
            ),
            "final_reward": st.column_config.NumberColumn("final reward", format="%.3f"),
            "eval_accuracy": st.column_config.NumberColumn("eval accuracy", format="%.3f"),
            "grad_norm_cv": st.column_config.NumberColumn("grad-norm CV", format="%.3f", help=LIVE_HELP),
            "spikes": st.column_config.NumberColumn("spikes", help=LIVE_HELP),
            "spike_steps": st.column_config.TextColumn("spike steps", help=LIVE_HELP),
        },
    )


def _curves(runs: list[str], c: dict) -> None:
    steps = {common.run_name(r): data.table(r, "steps") for r in runs}
    if all(df.empty for df in steps.values()):
        common.empty("No steps table in the picked runs.", NO_STEPS)
        return
    options = plottable_metrics(steps)
    urlstate.default("ov_metrics_pick", [m for m in OVERVIEW_METRICS if m in options])
    st.session_state["ov_metrics_pick"] = [m for m in st.session_state["ov_metrics_pick"] if m in options]
    metrics = st.multiselect(
        "Metrics",
        options,
        format_func=metric_label,
        key="ov_metrics_pick",
        help="Every numeric column of the steps table can be plotted.",
    )
    urlstate.push()
    if not metrics:
        st.info("Pick metrics to plot.")
        return
    fig = make_overview_figure(
        steps, metrics, smoothing=c["smoothing"], x_axis=c["x_axis"], colors=common.colors()
    )
    common.chart(fig, "ov_metrics", "training_curves")


def _grad_norms(runs: list[str], c: dict) -> None:
    layers = {common.run_name(r): data.table(r, "layers") for r in runs}
    steps = {common.run_name(r): data.table(r, "steps") for r in runs}
    missing = [name for name, df in layers.items() if df.empty]
    if missing:
        common.empty(f"No gradient norms (layers table) in: {', '.join(missing)}.", NO_LAYERS)
    layers = {k: v for k, v in layers.items() if not v.empty}
    if not layers:
        return
    fig = make_grad_norm_figure(
        layers,
        smoothing=c["smoothing"],
        log_y=c["log_y"],
        spike_k=c["spike_k"],
        x_axis=c["x_axis"],
        steps=steps,
        colors=common.colors(),
        title="Total gradient norm before clipping",
    )
    common.chart(fig, "ov_gradnorm", "grad_norm_total")
    notes = " · ".join(f"{n}: {count_note(run_grad_norms(df), STEP.grad_norm)}" for n, df in layers.items())
    st.caption(
        notes + ". Steps without a gradient (every advantage 0) are gaps marked at the bottom; the "
        "smoothing and the spike search skip them."
    )
    _per_layer([r for r in runs if common.run_name(r) in layers], layers, c)


def _per_layer(runs: list[str], layers: dict, c: dict) -> None:
    c1, c2 = st.columns([3, 1])
    with c1:
        run = common.pick_one(runs, "ov_layer_run", "Per-layer run")
    top_k = c2.number_input(
        "highlighted blocks",
        1,
        20,
        DEFAULT_TOP_K,
        key="ov_top_k",
        help="The blocks with the largest median gradient norm are coloured; the rest grey.",
    )
    name = common.run_name(run)
    df = layers[name]
    if not layer_names(df):
        common.empty("This run recorded only the total gradient norm.", NO_LAYERS)
        return
    common.chart(
        make_layer_grad_norm_figure(
            df,
            top_k=int(top_k),
            smoothing=c["smoothing"],
            log_y=c["log_y"],
            title=f"Per-layer gradient norms: {name}",
        ),
        "ov_layers",
        f"grad_norm_layers_{name}",
    )
    common.chart(
        make_layer_heatmap_figure(df, title=f"Step x layer gradient norm: {name}"),
        "ov_heat",
        f"grad_norm_heatmap_{name}",
    )


def render() -> None:
    st.title("Overview")
    runs = common.require_runs()
    c = _controls()
    urlstate.push()
    with common.guard("Run summary"):
        _summary(runs, c["spike_k"])
    with common.guard("Training curves"):
        _curves(runs, c)
    st.subheader("Gradient norms")
    with common.guard("Gradient norms"):
        _grad_norms(runs, c)
    common.show_run_warnings(runs)


render()
