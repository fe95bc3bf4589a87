"""The papers' figure set of `tokengrad export`: which figures, from which tables, and which are left out.

    specs, notes = build_figure_set({"grpo": load_run("runs/grpo")})

Run-comparison figures overlay every run (the headline, each probability bucket's share of the update;
reward, entropy, gradient norm, accuracy by difficulty, weight curves); per-run figures (share of tokens vs
share of the update and of the summed gradient norm, bucket token vs update shares, bucket update shares
over steps, gradient norm vs probability, per-layer norms, word clouds) carry the run's name as their
title. A figure without data, or one that would print "NaN" in a label, is left out with a one-line note
saying why. headline_table gives the headline numbers per run (headline.csv of `tokengrad export`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go

from tokengrad.schema import BUCKET, STEP

_NAN_WORD = re.compile(r"(?<![A-Za-z])nan(?![A-Za-z])", re.IGNORECASE)


class FigureSpec(NamedTuple):
    name: str  # file stem
    figure: go.Figure
    width: str = "column"  # figures.style.PAPER_WIDTHS key
    height_in: float | None = None
    keep_title: bool = False  # per-run figures keep the run name as their title


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "run"


def unique_names(runs: Sequence) -> dict[str, object]:
    """run name -> run, names made unique with #2, #3 ... in order."""
    out: dict[str, object] = {}
    for run in runs:
        name, i = run.name, 1
        while name in out:
            i += 1
            name = f"{run.name}#{i}"
        out[name] = run
    return out


def _texts(fig: go.Figure):
    """Every label the figure prints: titles, annotations, trace text and categorical ticks."""
    lay = fig.layout
    yield lay.title.text
    yield from (a.text for a in lay.annotations or ())
    for t in fig.data:
        yield t.name
        text = getattr(t, "text", None)
        yield from ([text] if isinstance(text, str) else list(text) if text is not None else [])
        for axis in ("x", "y"):
            values = getattr(t, axis, None)
            categorical = values is not None and len(values) and isinstance(values[0], str)
            if categorical and t.type in ("bar", "heatmap"):
                yield from values


def nan_label(fig: go.Figure) -> str | None:
    """Why the figure would print a NaN label (None when it would not): a 'nan' word in a title,
    annotation, legend entry, trace text or category, or a bar labelled from a non-finite value."""
    for text in _texts(fig):
        if isinstance(text, str) and _NAN_WORD.search(text):
            return f"a label would read {text!r}"
        if isinstance(text, float) and math.isnan(text):
            return "a label would read 'nan'"
    for t in fig.data:
        if getattr(t, "texttemplate", None) and t.y is not None:
            y = np.asarray(t.y, dtype=float)
            if (~np.isfinite(y)).any():
                return f"'{t.name}' has undefined values that its labels would print as NaN"
    return None


def _comparison_specs(runs: Mapping[str, object], smoothing: float, colors: dict) -> list[FigureSpec]:
    from tokengrad.figures import (
        make_accuracy_by_difficulty_figure,
        make_grad_norm_figure,
        make_metric_figure,
        make_weight_curve_figure,
    )
    from tokengrad.figures.headline import make_headline_figure
    from tokengrad.read.headline import pooled_bucket_shares

    steps = {n: r.steps for n, r in runs.items()}
    pooled = {
        n: pooled_bucket_shares(r.buckets, layers=r.layers) if len(r.buckets) else r.buckets
        for n, r in runs.items()
    }
    return [
        FigureSpec("headline_update_share", make_headline_figure(pooled, colors=colors), "page"),
        FigureSpec("reward", make_metric_figure(steps, STEP.reward_mean, smoothing=smoothing, colors=colors)),
        FigureSpec(
            "entropy", make_metric_figure(steps, STEP.entropy_mean, smoothing=smoothing, colors=colors)
        ),
        FigureSpec(
            "grad_norm",
            make_grad_norm_figure({n: r.layers for n, r in runs.items()}, smoothing=smoothing, colors=colors),
        ),
        FigureSpec(
            "accuracy_by_difficulty",
            make_accuracy_by_difficulty_figure({n: r.evals for n, r in runs.items()}, colors=colors),
        ),
        FigureSpec(
            "weight_curves", make_weight_curve_figure({n: r.meta for n, r in runs.items()}, colors=colors)
        ),
    ]


def _run_specs(name: str, run, smoothing: float, low, high, step_range, max_words: int) -> list[FigureSpec]:
    from tokengrad.figures import (
        make_bucket_share_figure,
        make_bucket_steps_figure,
        make_grad_vs_prob_figure,
        make_gradient_share_figure,
        make_layer_grad_norm_figure,
    )
    from tokengrad.figures.probability import with_update_shares
    from tokengrad.figures.wordclouds import make_high_low_wordcloud_figure
    from tokengrad.read.gradient_shares import gradient_by_bucket
    from tokengrad.read.headline import pooled_bucket_shares
    from tokengrad.read.queries import grad_norm_by_prob, token_frequencies

    slug = _slug(name)
    words = dict(step_range=step_range, limit=4 * max_words)
    pooled = pooled_bucket_shares(run.buckets, step_range, layers=run.layers) if len(run.buckets) else None
    shares = with_update_shares(gradient_by_bucket(run, step_range=step_range), pooled)
    specs = [
        FigureSpec(f"gradient_share_{slug}", make_gradient_share_figure(shares, title=name)),
        FigureSpec(f"bucket_shares_{slug}", make_bucket_share_figure(run.buckets, step_range, title=name)),
        FigureSpec(
            f"bucket_update_share_{slug}",
            make_bucket_steps_figure(run.buckets, BUCKET.update_share, title=name),
            "page",
        ),
        FigureSpec(
            f"grad_vs_prob_{slug}",
            make_grad_vs_prob_figure(grad_norm_by_prob(run, step_range=step_range), title=name),
        ),
        FigureSpec(
            f"grad_norm_layers_{slug}",
            make_layer_grad_norm_figure(run.layers, smoothing=smoothing, title=name),
            "page",
        ),
        FigureSpec(
            f"wordcloud_{slug}",
            make_high_low_wordcloud_figure(
                token_frequencies(run, *high, **words),
                token_frequencies(run, *low, **words),
                titles=(f"p ≥ {high[0]:g}", f"p < {low[1]:g}"),
                width=1200,
                height=600,
                max_words=max_words,
                show_whitespace=False,
                title=name,
            ),
            "page",
            2.6,
        ),
    ]
    return [s._replace(keep_title=True) for s in specs]


def build_figure_set(
    runs: Mapping[str, object],
    *,
    smoothing: float = 0.6,
    low: tuple[float, float] = (0.0, 0.25),
    high: tuple[float, float] = (0.75, 1.0),
    step_range: tuple[int, int] | None = None,
    max_words: int = 150,
) -> tuple[list[FigureSpec], list[str]]:
    """The papers' figures for runs keyed by name; returns (specs, one note per figure left out: no data,
    or a label that would read NaN)."""
    from tokengrad.figures.style import run_colors

    colors = run_colors(list(runs))  # one colour per run across the whole figure set
    specs = _comparison_specs(runs, smoothing, colors)
    for name, run in runs.items():
        specs += _run_specs(name, run, smoothing, low, high, step_range, max_words)
    kept, notes = [], []
    for s in specs:
        why = _why_empty(s.figure) if not s.figure.data else nan_label(s.figure)
        if why:
            notes.append(f"{s.name}: {why}")
        else:
            kept.append(s)
    return kept, notes


def headline_table(runs: Mapping[str, object], step_range: tuple[int, int] | None = None):
    """One row per run: the headline shares (tokengrad.read.headline.low_prob_shares), for headline.csv."""
    import pandas as pd

    from tokengrad.read.headline import low_prob_shares

    rows = []
    for name, run in runs.items():
        h = low_prob_shares(run, step_range)
        rows.append(
            {
                "run": name,
                "below": h.below,
                "token_share": h.token_share,
                "update_share": h.update_share,
                "n_updates": h.n_updates,
                "source": h.source,
            }
        )
    return pd.DataFrame(rows)


def _why_empty(fig: go.Figure) -> str:
    return fig.layout.annotations[0].text if fig.layout.annotations else "no data"
