"""Evaluation views: accuracy by difficulty per run (TR-GRPO arXiv 2511.00066 Fig. 2 style) and over steps.

    make_accuracy_by_difficulty_figure({"grpo": run_a.evals, "tr_grpo": run_b.evals})

Inputs are the run format's evals table (step, rank, task, difficulty, accuracy, n) keyed by run name.
Accuracy over several difficulties or ranks is the n-weighted mean, i.e. the share of all problems solved.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tokengrad.figures.style import dashboard_layout, empty_figure, run_colors
from tokengrad.schema import EVAL


def difficulty_order(labels) -> list[str]:
    """Distinct labels, numerically sorted when they all parse as numbers (so '10' follows '9')."""
    labels = list(dict.fromkeys(str(x) for x in labels))
    try:
        return sorted(labels, key=float)
    except ValueError:
        return sorted(labels)


def _weighted_accuracy(g: pd.DataFrame) -> float:
    acc = g[EVAL.accuracy].to_numpy(dtype=float)
    n = pd.to_numeric(g[EVAL.n], errors="coerce").fillna(0).to_numpy(dtype=float)
    ok = np.isfinite(acc)
    if n[ok].sum() > 0:
        return float((acc[ok] * n[ok]).sum() / n[ok].sum())
    return float(acc[ok].mean()) if ok.any() else float("nan")


def _task(evals: pd.DataFrame, task: str | None) -> pd.DataFrame:
    return evals if task is None else evals[evals[EVAL.task] == task]


def accuracy_by_difficulty(
    evals: pd.DataFrame, step: int | None = None, task: str | None = None
) -> pd.DataFrame:
    """[difficulty, accuracy, n] at `step` (default: the last evaluated step), difficulties ordered."""
    df = _task(evals, task)
    if df.empty:
        return pd.DataFrame(columns=[EVAL.difficulty, EVAL.accuracy, EVAL.n])
    step = df[EVAL.step].max() if step is None else step
    df = df[df[EVAL.step] == step]
    rows = [
        (d, _weighted_accuracy(g), int(pd.to_numeric(g[EVAL.n], errors="coerce").fillna(0).sum()))
        for d, g in df.groupby(df[EVAL.difficulty].astype(str))
    ]
    out = pd.DataFrame(rows, columns=[EVAL.difficulty, EVAL.accuracy, EVAL.n])
    order = difficulty_order(out[EVAL.difficulty])
    return out.set_index(EVAL.difficulty).loc[order].reset_index()


def accuracy_over_steps(
    evals: pd.DataFrame, task: str | None = None, difficulty: str | None = None
) -> pd.DataFrame:
    """[step, accuracy]: n-weighted accuracy over difficulties (or one difficulty) per evaluated step."""
    df = _task(evals, task)
    if difficulty is not None:
        df = df[df[EVAL.difficulty].astype(str) == str(difficulty)]
    rows = [(s, _weighted_accuracy(g)) for s, g in df.groupby(EVAL.step)]
    return pd.DataFrame(rows, columns=[EVAL.step, EVAL.accuracy])


def make_accuracy_by_difficulty_figure(
    evals: Mapping[str, pd.DataFrame],
    *,
    step: int | None = None,
    task: str | None = None,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Grouped bars: accuracy per difficulty, one bar colour per run, at each run's last eval (or `step`)."""
    cmap = run_colors(evals, colors)
    fig = go.Figure()
    order: list[str] = []
    for name, df in evals.items():
        t = accuracy_by_difficulty(df, step, task)
        if t.empty:
            continue
        order = difficulty_order(order + t[EVAL.difficulty].tolist())
        fig.add_trace(
            go.Bar(
                x=t[EVAL.difficulty],
                y=t[EVAL.accuracy],
                name=name,
                marker_color=cmap[name],
                customdata=t[EVAL.n],
                hovertemplate="difficulty %{x}<br>accuracy %{y:.1%} (n=%{customdata})"
                f"<extra>{name}</extra>",
            )
        )
    if not fig.data:
        return empty_figure("no evaluations recorded", title)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="difficulty", type="category", categoryorder="array", categoryarray=order)
    fig.update_yaxes(title="accuracy", tickformat=".0%", range=[0, 1])
    return dashboard_layout(fig, title)


def make_accuracy_over_steps_figure(
    evals: Mapping[str, pd.DataFrame],
    *,
    task: str | None = None,
    by_difficulty: bool = False,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Accuracy over training steps per run; with by_difficulty, one small multiple per difficulty."""
    cmap = run_colors(evals, colors)
    groups = [None]
    if by_difficulty:
        groups = difficulty_order(
            pd.concat([_task(df, task)[EVAL.difficulty].astype(str) for df in evals.values()])
            if evals
            else []
        )
    if not groups:
        return empty_figure("no evaluations recorded", title)
    fig = make_subplots(
        rows=1,
        cols=len(groups),
        shared_yaxes=True,
        subplot_titles=[f"difficulty {g}" for g in groups] if by_difficulty else None,
    )
    for j, group in enumerate(groups):
        for name, df in evals.items():
            t = accuracy_over_steps(df, task, group)
            if t.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=t[EVAL.step],
                    y=t[EVAL.accuracy],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=j == 0,
                    line=dict(color=cmap[name]),
                    hovertemplate=f"step %{{x}}<br>accuracy %{{y:.1%}}<extra>{name}</extra>",
                ),
                row=1,
                col=j + 1,
            )
    if not fig.data:
        return empty_figure("no evaluations recorded", title)
    fig.update_xaxes(title="step")
    fig.update_yaxes(tickformat=".0%", range=[0, 1])
    fig.update_yaxes(title="accuracy", row=1, col=1)
    return dashboard_layout(fig, title)
