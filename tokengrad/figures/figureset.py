"""The papers' figure set of `tokengrad export`: which figures, from which tables, and which are left out.

    specs, notes, failed = build_figure_set({"grpo": load_run("runs/grpo")})

Run-comparison figures overlay every run (the headline, each probability bucket's share of the update;
reward, entropy, gradient norm, accuracy by difficulty, weight curves); per-run figures (share of tokens vs
share of the update and of the summed gradient norm, the actual vs what-if gradient norms where the run
recorded other rules' updates, bucket token vs update shares, bucket update shares
over steps, gradient norm vs probability, per-layer norms, word clouds) carry the run's name as their
title. A figure without data, or one that would print "NaN" in a label, is left out with a one-line note
saying why; a figure whose tables or drawing raise is left out and listed in `failed`, and the rest are
drawn. headline_table gives the headline numbers per run (headline.csv of `tokengrad export`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import plotly.graph_objects as go

from tokengrad.read.display import slug as file_stem
from tokengrad.schema import BUCKET, STEP

_NAN_WORD = re.compile(r"(?<![A-Za-z])nan(?![A-Za-z])", re.IGNORECASE)


class FigureSpec(NamedTuple):
    name: str  # file stem
    figure: go.Figure
    width: str = "column"  # figures.style.PAPER_WIDTHS key
    height_in: float | None = None
    keep_title: bool = False  # per-run figures keep the run name as their title


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


class _Pending(NamedTuple):
    """A figure not drawn yet: `make` reads its tables and draws it, so one failure stays one figure's."""

    name: str
    make: Callable[[], go.Figure]
    width: str = "column"
    height_in: float | None = None


class FigureSet(NamedTuple):
    specs: list[FigureSpec]  # drawn, to be written
    notes: list[str]  # "name: why" per figure left out on purpose: no data, or a label reading NaN
    failed: list[str]  # "name: error" per figure whose data or drawing raised; the others are kept


def _comparison_specs(runs: Mapping[str, object], smoothing: float, colors: dict) -> list[_Pending]:
    from tokengrad.figures import (
        make_accuracy_by_difficulty_figure,
        make_grad_norm_figure,
        make_metric_figure,
        make_weight_curve_figure,
    )
    from tokengrad.figures.headline import make_headline_figure
    from tokengrad.read.headline import pooled_bucket_shares

    def headline():
        pooled = {
            n: pooled_bucket_shares(r.buckets, layers=r.layers) if len(r.buckets) else r.buckets
            for n, r in runs.items()
        }
        return make_headline_figure(pooled, colors=colors)

    def metric(column):
        return lambda: make_metric_figure(
            {n: r.steps for n, r in runs.items()}, column, smoothing=smoothing, colors=colors
        )

    return [
        _Pending("headline_update_share", headline, "page"),
        _Pending("reward", metric(STEP.reward_mean)),
        _Pending("entropy", metric(STEP.entropy_mean)),
        _Pending(
            "grad_norm",
            lambda: make_grad_norm_figure(
                {n: r.layers for n, r in runs.items()}, smoothing=smoothing, colors=colors
            ),
        ),
        _Pending(
            "accuracy_by_difficulty",
            lambda: make_accuracy_by_difficulty_figure({n: r.evals for n, r in runs.items()}, colors=colors),
        ),
        _Pending(
            "weight_curves",
            lambda: make_weight_curve_figure({n: r.meta for n, r in runs.items()}, colors=colors),
        ),
    ]


def _run_specs(name: str, run, *, smoothing: float, low, high, step_range, max_words: int) -> list[_Pending]:
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

    slug = file_stem(name, "run", keep=".")
    words = dict(step_range=step_range, limit=4 * max_words)

    def gradient_share():
        pooled = (
            pooled_bucket_shares(run.buckets, step_range, layers=run.layers) if len(run.buckets) else None
        )
        shares = with_update_shares(gradient_by_bucket(run, step_range=step_range), pooled)
        return make_gradient_share_figure(shares, title=name)

    def wordcloud():
        return make_high_low_wordcloud_figure(
            token_frequencies(run, *high, **words),
            token_frequencies(run, *low, **words),
            titles=(f"p ≥ {high[0]:g}", f"p < {low[1]:g}"),
            width=1200,
            height=600,
            max_words=max_words,
            show_whitespace=False,
            title=name,
        )

    whatif = _whatif_specs(name, run, slug)
    return whatif + [
        _Pending(f"gradient_share_{slug}", gradient_share),
        _Pending(
            f"bucket_shares_{slug}", lambda: make_bucket_share_figure(run.buckets, step_range, title=name)
        ),
        _Pending(
            f"bucket_update_share_{slug}",
            lambda: make_bucket_steps_figure(run.buckets, BUCKET.update_share, title=name),
            "page",
        ),
        _Pending(
            f"grad_vs_prob_{slug}",
            lambda: make_grad_vs_prob_figure(grad_norm_by_prob(run, step_range=step_range), title=name),
        ),
        _Pending(
            f"grad_norm_layers_{slug}",
            lambda: make_layer_grad_norm_figure(run.layers, smoothing=smoothing, title=name),
            "page",
        ),
        _Pending(name=f"wordcloud_{slug}", make=wordcloud, width="page", height_in=2.6),
    ]


def _whatif_specs(name: str, run, slug: str) -> list[_Pending]:
    """The actual vs what-if gradient norms, for a run that recorded what-if updates (WhatIf)."""
    if not run.meta.get("whatif_every"):
        return []
    from tokengrad.figures.whatif import make_whatif_norm_figure
    from tokengrad.read.whatif_frames import norm_trajectories

    def norms():
        return make_whatif_norm_figure(norm_trajectories(run.table("whatif"), run.layers), title=name)

    return [_Pending(f"whatif_grad_norm_{slug}", norms, "page")]


def build_figure_set(
    runs: Mapping[str, object],
    *,
    smoothing: float = 0.6,
    low: tuple[float, float] = (0.0, 0.25),
    high: tuple[float, float] = (0.75, 1.0),
    step_range: tuple[int, int] | None = None,
    max_words: int = 150,
) -> FigureSet:
    """The papers' figures for runs keyed by name: (specs, one note per figure left out: no data, or a
    label that would read NaN, one line per figure that failed to draw). A figure whose tables or drawing
    raise is reported in `failed` and the rest are still drawn."""
    from tokengrad.figures.style import run_colors

    colors = run_colors(list(runs))  # one colour per run across the whole figure set
    pending = [(p, False) for p in _comparison_specs(runs, smoothing, colors)]
    for name, run in runs.items():  # per-run figures keep the run's name as their title
        pending += [
            (p, True)
            for p in _run_specs(
                name, run, smoothing=smoothing, low=low, high=high, step_range=step_range, max_words=max_words
            )
        ]
    kept, notes, failed = [], [], []
    for p, keep_title in pending:
        try:
            fig = p.make()
        except Exception as err:  # one figure's bad data must not cost the others; reported, not hidden
            failed.append(f"{p.name}: {one_line(err)}")
            continue
        why = _why_empty(fig) if not fig.data else nan_label(fig)
        if why:
            notes.append(f"{p.name}: {why}")
        else:
            kept.append(
                FigureSpec(
                    name=p.name, figure=fig, width=p.width, height_in=p.height_in, keep_title=keep_title
                )
            )
    return FigureSet(kept, notes, failed)


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


def one_line(err: BaseException) -> str:
    """'TypeName: message' on one line, hidden characters escaped (a message may quote token text)."""
    from tokengrad.read.display import visible_text

    return visible_text(" ".join(f"{type(err).__name__}: {err}".split()))


def _why_empty(fig: go.Figure) -> str:
    return fig.layout.annotations[0].text if fig.layout.annotations else "no data"
