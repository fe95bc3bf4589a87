"""Evaluation views: accuracy by difficulty per run (TR-GRPO arXiv 2511.00066 Fig. 2 style) and over steps.

    make_accuracy_by_difficulty_figure({"grpo": run_a.evals, "tr_grpo": run_b.evals})

Inputs are the run format's evals table (step, rank, task, difficulty, accuracy, n) keyed by run name.
Accuracy over several difficulties or ranks is the n-weighted mean, i.e. the share of all problems solved.
Every accuracy carries its n and a 95 % Wilson score interval (Wilson 1927, "Probable inference, the law of
succession, and statistical inference", JASA 22), which stays inside [0, 1] and is not empty at 0 % or
100 %, where the normal approximation collapses. Bars are labelled with their value, so a 0 % bar reads
"0%" while a difficulty a run was not evaluated on has no bar and reads "not evaluated".
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


WILSON_Z = 1.959964  # two-sided 95 % normal quantile


def wilson_interval(accuracy, n, z: float = WILSON_Z) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) of the Wilson score interval for a share `accuracy` of n trials (NaN where n = 0):

    centre = (p + z²/2n) / (1 + z²/n),  half = z / (1 + z²/n) * sqrt(p (1 - p) / n + z² / 4n²)
    """
    p = np.asarray(accuracy, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = 1 + z**2 / n
        centre = (p + z**2 / (2 * n)) / denom
        half = z / denom * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2))
    ok = n > 0
    return np.where(ok, centre - half, np.nan), np.where(ok, centre + half, np.nan)


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
    """[difficulty, accuracy, n, lo, hi] at `step` (default: the last evaluated step), difficulties ordered;
    lo, hi is the 95 % Wilson interval."""
    df = _task(evals, task)
    if df.empty:
        return pd.DataFrame(columns=[EVAL.difficulty, EVAL.accuracy, EVAL.n, "lo", "hi"])
    step = df[EVAL.step].max() if step is None else step
    df = df[df[EVAL.step] == step]
    rows = [
        (d, _weighted_accuracy(g), int(pd.to_numeric(g[EVAL.n], errors="coerce").fillna(0).sum()))
        for d, g in df.groupby(df[EVAL.difficulty].astype(str))
    ]
    out = pd.DataFrame(rows, columns=[EVAL.difficulty, EVAL.accuracy, EVAL.n])
    order = difficulty_order(out[EVAL.difficulty])
    return _with_interval(out.set_index(EVAL.difficulty).loc[order].reset_index())


def _with_interval(df: pd.DataFrame) -> pd.DataFrame:
    lo, hi = wilson_interval(df[EVAL.accuracy], df[EVAL.n])
    return df.assign(lo=lo, hi=hi)


def accuracy_over_steps(
    evals: pd.DataFrame, task: str | None = None, difficulty: str | None = None
) -> pd.DataFrame:
    """[step, accuracy, n, lo, hi]: n-weighted accuracy over difficulties (or one difficulty) per evaluated
    step, with its problem count and 95 % Wilson interval."""
    df = _task(evals, task)
    if difficulty is not None:
        df = df[df[EVAL.difficulty].astype(str) == str(difficulty)]
    rows = [
        (s, _weighted_accuracy(g), int(pd.to_numeric(g[EVAL.n], errors="coerce").fillna(0).sum()))
        for s, g in df.groupby(EVAL.step)
    ]
    return _with_interval(pd.DataFrame(rows, columns=[EVAL.step, EVAL.accuracy, EVAL.n]))


def _error_y(t: pd.DataFrame) -> dict:
    return dict(
        type="data",
        symmetric=False,
        array=(t["hi"] - t[EVAL.accuracy]).clip(lower=0),
        arrayminus=(t[EVAL.accuracy] - t["lo"]).clip(lower=0),
        thickness=1.2,
        width=3,
    )


def make_accuracy_by_difficulty_figure(
    evals: Mapping[str, pd.DataFrame],
    *,
    step: int | None = None,
    task: str | None = None,
    colors: Mapping[str, str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Grouped bars: accuracy per difficulty, one bar colour per run, at each run's last eval (or `step`),
    labelled with the value and n, with 95 % Wilson intervals; a difficulty a run lacks reads "not
    evaluated"."""
    cmap = run_colors(evals, colors)
    tables = {name: accuracy_by_difficulty(df, step, task) for name, df in evals.items()}
    tables = {k: t for k, t in tables.items() if not t.empty}
    if not tables:
        return empty_figure("no evaluations recorded", title)
    order = difficulty_order([d for t in tables.values() for d in t[EVAL.difficulty]])
    ticks = _difficulty_ticks(tables, order)
    fig = go.Figure()
    for name, t in tables.items():
        t = t.set_index(EVAL.difficulty).reindex(order).reset_index()
        missing = t[EVAL.accuracy].isna()
        text = [  # n goes under the tick when every run has the same n there (one label, no collisions)
            ("not evaluated" if m else f"{a:.0%}" + ("" if "n=" in ticks[d] else f"<br>n={int(n)}"))
            for m, a, n, d in zip(missing, t[EVAL.accuracy].fillna(0), t[EVAL.n].fillna(0), order)
        ]
        fig.add_trace(
            go.Bar(
                x=order,
                y=t[EVAL.accuracy].fillna(0),
                name=name,
                marker_color=cmap[name],
                marker_line=dict(color=cmap[name], width=1.5),
                text=text,
                textposition="outside",
                error_y=_error_y(t.fillna({EVAL.accuracy: 0, "lo": 0, "hi": 0})),
                customdata=np.stack([t[EVAL.n].fillna(0), t["lo"].fillna(0), t["hi"].fillna(0)], axis=1),
                hovertemplate="difficulty %{x}<br>accuracy %{y:.1%} of n=%{customdata[0]}<br>95% interval "
                f"%{{customdata[1]:.1%}} to %{{customdata[2]:.1%}}<extra>{name}</extra>",
            )
        )
    fig.update_layout(barmode="group", uniformtext=dict(minsize=7, mode="hide"))
    fig.update_xaxes(
        title="difficulty",
        type="category",
        categoryorder="array",
        categoryarray=order,
        tickvals=order,
        ticktext=[ticks[d] for d in order],
    )
    fig.update_yaxes(title="accuracy (95% Wilson interval)", tickformat=".0%", range=[0, 1.15])
    return dashboard_layout(fig, title)


def _difficulty_ticks(tables: Mapping[str, pd.DataFrame], order: list) -> dict:
    """difficulty -> its tick label: 'd<br>n=N' when every run that has it evaluated N problems there."""
    out = {}
    for d in order:
        ns = {int(n) for t in tables.values() for n in t.loc[t[EVAL.difficulty] == d, EVAL.n].dropna()}
        out[d] = f"{d}<br>n={ns.pop()}" if len(ns) == 1 else str(d)
    return out


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
                    error_y=_error_y(t),
                    customdata=t[EVAL.n],
                    hovertemplate=f"step %{{x}}<br>accuracy %{{y:.1%}} of n=%{{customdata}}"
                    f"<extra>{name}</extra>",
                ),
                row=1,
                col=j + 1,
            )
    if not fig.data:
        return empty_figure("no evaluations recorded", title)
    fig.update_xaxes(title="step")
    fig.update_yaxes(tickformat=".0%", range=[0, 1])
    fig.update_yaxes(title="accuracy (95% Wilson interval)", row=1, col=1)
    return dashboard_layout(fig, title)
