"""Overview, the landing page: the run doctor's findings first (a slot kept at the top), then the tool's
question answered per run (which share of the update the low-probability tokens make, in the summary
table and on one chart overlaying the picked runs), then per-step training curves and gradient-norm
trajectories."""

from __future__ import annotations

import numpy as np
import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common, findings, hints, urlstate
from tokengrad.app.views.sidebar import run_title
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
)
from tokengrad.figures.headline import make_headline_figure
from tokengrad.figures.liveness import LIVE_HELP
from tokengrad.figures.smoothing import DEFAULT_SPIKE_K
from tokengrad.figures.summary import summarize_run
from tokengrad.read.headline import (
    DEFINITION,
    TOKEN_SHARE_NAME,
    UPDATE_SHARE_NAME,
    low_prob_label,
)

STATUS_HELP = (
    "finished: the recorder closed the run; crashed: the training loop raised; stopped: never closed and "
    "its recording process is gone (killed, out of memory): known at once on the machine that recorded it, "
    "else after 15 min without a write; running: its recording process runs, or files were written in the "
    "last 15 min."
)


def _controls() -> dict:
    urlstate.default("ov_smooth", 0.6)
    urlstate.default("ov_logy", True)
    urlstate.default("ov_x", "step")
    c1, c2, c3, c4 = st.columns([3, 2, 1, 1])
    smoothing = c1.slider(
        "Smoothing (debiased EMA weight)",
        0.0,
        urlstate.SMOOTH_MAX,
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


def _summary_row(r: str, spike_k: float) -> dict:
    row = summarize_run(
        common.run_name(r),
        data.meta(r),
        data.table(r, "steps"),
        layers=data.table(r, "layers"),
        evals=data.table(r, "evals"),
        spike_k=spike_k,
    )
    state = data.status(r)
    head = data.low_prob_shares(r)
    row.pop("run")
    row = {"run": run_title(r), "status": state.state, **row}  # the folder, meta.json's name beside it
    row["low_tokens"], row["low_update"] = head.token_share, head.update_share
    return row


def _summary(runs: list[str], spike_k: float) -> None:
    rows = [_summary_row(r, spike_k) for r in runs]
    below = low_prob_label()
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        column_order=[
            "run",
            "status",
            "low_tokens",
            "low_update",
            *[k for k in rows[0] if k not in ("run", "status", "low_tokens", "low_update")],
        ],
        column_config={
            "status": st.column_config.TextColumn("status", help=STATUS_HELP),
            "low_tokens": st.column_config.NumberColumn(
                f"{below}: {TOKEN_SHARE_NAME}", format="percent", help=f"Over the whole run. {DEFINITION}."
            ),
            "low_update": st.column_config.NumberColumn(
                f"{below}: {UPDATE_SHARE_NAME}",
                format="percent",
                help=f"Over the whole run, from the bucket analysis (empty without one). {DEFINITION}.",
            ),
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


def _headline(runs: list[str]) -> None:
    """The picked runs' share of tokens and of the update per probability bucket, on one chart."""
    shares = {common.run_name(r): data.pooled_shares(r) for r in runs}
    below = low_prob_label()
    parts = [
        f"{n}: {h.update_share:.0%} of the update from {h.token_share:.0%} of the loss tokens"
        for n, h in ((common.run_name(r), data.low_prob_shares(r)) for r in runs)
        if np.isfinite(h.update_share)
    ]
    if parts:
        st.markdown(f"**Tokens with {below}** — " + " · ".join(parts))
    fig = make_headline_figure(shares, colors=common.colors(), title="Which tokens make the update")
    common.chart(fig, "ov_headline", "headline_update_share")
    st.caption(f"{DEFINITION}; over every analysed update with a gradient of each run.")
    for r in runs:
        if not len(shares[common.run_name(r)]):
            common.empty(f"No bucket analysis in {common.run_name(r)}.", hints.hint(data.meta(r), "buckets"))


def _waiting(runs: list[str]) -> list[str]:
    """Runs without a steps table yet: 'waiting for the first step' when running, why when stopped, else how
    to record."""
    out = []
    for r in runs:
        if data.table(r, "steps").empty:
            out.append(r)
            state = data.status(r)
            if state.state == "running":
                st.info(f"{common.run_name(r)}: waiting for the first step.", icon=":material/hourglass_top:")
            elif state.state == "stopped":
                st.warning(f"{common.run_name(r)} stopped: {state.why}.", icon=":material/stop_circle:")
            else:
                lost = common.lost_note(r, "steps")
                how = "" if lost else hints.hint(data.meta(r), "steps")
                common.empty(f"No steps table in {common.run_name(r)}.{lost}", how)
    return out


def _curves(runs: list[str], c: dict) -> None:
    steps = {common.run_name(r): data.table(r, "steps") for r in runs}
    if all(df.empty for df in steps.values()):
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
    for name in missing:
        meta = data.meta(next(r for r in runs if common.run_name(r) == name))
        common.empty(f"No gradient norms (layers table) in {name}.", hints.hint(meta, "layers"))
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
    st.caption(
        "Steps without a gradient (every advantage 0) are gaps marked at the bottom; the smoothing and the "
        "spike search skip them."
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
        common.empty("This run recorded only the total gradient norm.", hints.hint(data.meta(run), "layers"))
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
    with st.container(), common.guard("Findings"):  # the run doctor's findings, above everything else
        findings.render(runs)
    c = _controls()
    urlstate.push()
    with common.guard("Run summary"):
        _summary(runs, c["spike_k"])
        _waiting(runs)
    with common.guard("Which tokens make the update"):
        _headline(runs)
    with common.guard("Training curves"):
        _curves(runs, c)
    st.subheader("Gradient norms")
    with common.guard("Gradient norms"):
        _grad_norms(runs, c)
    common.show_run_warnings(runs)


render()
