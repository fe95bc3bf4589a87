"""Token inspector: one completion with each token coloured by a recorded per-token value.

    df = sample_tokens(run, step=40, sample_id=3)          # tokengrad.read.queries
    html = token_html(df, color_by="logit_grad_norm")        # st.html(html) /
                                                             # st.markdown(html, unsafe_allow_html=True)
    fig = make_token_figure(df, color_by="prob")             # the same as a plotly heatmap

Hovering a token shows every value recorded for it. Every scale is colour-blind safe (ColorBrewer's
RdYlBu / RdBu diverging and single-hue sequential scales, no red-green pair): probabilities on a fixed
[0, 1] red-yellow-blue scale, signed values (coef, advantage) diverging around 0, the PPO ratio diverging
around 1 (no change), the rest a sequential scale over the data.

Token text is shown as people read it (tokengrad.read.token_text): a character that a byte-level
tokenizer split over several tokens ('<0xE4>', '<0xB8>', '<0xAD>') is drawn whole on the token that
completes it ('中'), the tokens holding its earlier bytes read ◌; the hover keeps each token's stored text.
"""

from __future__ import annotations

import html as _html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale, unlabel_rgb

from tokengrad.figures.style import cap_text, dashboard_layout, empty_figure
from tokengrad.read.display import WHITESPACE_SYMBOLS, visible_text
from tokengrad.read.token_text import CONTINUATION, merge_tokens
from tokengrad.schema import TOK

# -coef: gradient descent moves log pi_t by about -lr * coef * |grad log pi_t|^2, so a positive push raises
# the token's probability (the coefficient itself is negative on a rewarded completion's tokens)
PUSH = "push"
PUSH_ENDS = ("pushed down", "pushed up")
# d = log pi_old - log mu: the trainer's log-prob minus the rollout engine's (tokengrad.read.rollout_queries)
GAP = "rollout_gap"
COLOR_SCALES = {
    PUSH: "RdBu",
    GAP: "RdBu",
    TOK.prob: "RdYlBu",
    TOK.logprob: "RdYlBu",
    TOK.weight: "Purples",
    TOK.coef: "RdBu",
    TOK.advantage: "RdBu",
    TOK.logit_grad_norm: "YlOrRd",
    TOK.head_grad_norm: "YlOrRd",
    TOK.logit_grad_unit: "YlOrRd",
    TOK.entropy: "YlOrRd",
    TOK.ratio: "RdBu",
}
SIGNED = frozenset({TOK.coef, TOK.advantage, PUSH, GAP})
CENTRES = {
    TOK.coef: 0.0,
    TOK.advantage: 0.0,
    TOK.ratio: 1.0,
    PUSH: 0.0,
    GAP: 0.0,
}  # diverging scales: the neutral value
FIXED_RANGES = {TOK.prob: (0.0, 1.0), TOK.logit_grad_unit: (0.0, float(np.sqrt(2.0)))}
# Columns shown on hover, in this order, when present.
HOVER_COLUMNS = (
    TOK.position,
    TOK.token_id,
    TOK.prob,
    TOK.logprob,
    TOK.old_logprob,
    TOK.ref_logprob,
    TOK.rollout_logprob,
    GAP,
    TOK.is_weight,
    TOK.masked_by,
    TOK.entropy,
    TOK.advantage,
    TOK.weight,
    TOK.coef,
    TOK.ratio,
    TOK.clipped,
    TOK.logit_grad_unit,
    TOK.logit_grad_norm,
    TOK.head_grad_norm,
    TOK.in_loss,
)
_KEYS = frozenset({TOK.step, TOK.rank, TOK.update_id, TOK.pass_id, TOK.sample_id, TOK.group_id, TOK.token})
TOKEN_SYMBOLS = {c: WHITESPACE_SYMBOLS[c] for c in "\n\t"}  # line breaks and tabs; other controls escaped


def color_range(
    values, column: str, vmin: float | None = None, vmax: float | None = None
) -> tuple[float, float]:
    """(lo, hi) of the colour scale: fixed for prob, symmetric around the neutral value for diverging
    columns (0 for coef and advantage, 1 for the ratio), else the data range."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if column in FIXED_RANGES:
        lo, hi = FIXED_RANGES[column]
    elif x.size == 0:
        lo, hi = 0.0, 1.0
    elif column in CENTRES or (x.min() < 0 < x.max() and column not in (TOK.logprob,)):
        c = CENTRES.get(column, 0.0)
        m = float(np.abs(x - c).max()) or 1.0
        lo, hi = c - m, c + m
    else:
        lo, hi = float(x.min()), float(x.max())
    lo, hi = (lo if vmin is None else vmin), (hi if vmax is None else vmax)
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def token_colors(
    values, column: str, vmin: float | None = None, vmax: float | None = None
) -> list[str | None]:
    """'rgb(r, g, b)' per value on the column's scale; None for missing values."""
    lo, hi = color_range(values, column, vmin, vmax)
    scale = COLOR_SCALES.get(column, "RdBu" if column in CENTRES else "YlOrRd")
    x = np.asarray(values, dtype=float)
    pos = np.clip((x - lo) / (hi - lo), 0.0, 1.0)
    ok = np.isfinite(pos)
    colors = sample_colorscale(scale, pos[ok].tolist()) if ok.any() else []
    it = iter(colors)
    return [next(it) if good else None for good in ok]


def _text_color(bg: str | None) -> str:
    """Black on light backgrounds, white on dark ones (relative luminance, ITU-R BT.709 weights)."""
    if bg is None:
        return "#222"
    r, g, b = unlabel_rgb(bg)
    return "#000" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 140 else "#fff"


def display_token(text: str) -> str:
    """Token text made visible: newlines and tabs as ↵ / ⇥, other controls, bidi overrides and zero-width
    characters as escapes (tokengrad.read.display: \\u202e, \\x1b), an empty token as ∅, a long one
    capped."""
    if not text:
        return "∅"
    return cap_text(visible_text(cap_text(text), symbols=TOKEN_SYMBOLS))


PART_NOTE = "\n◌: its bytes begin a character drawn whole on a later token"


def display_tokens(texts) -> list[str]:
    """display_token of each token of one completion (in position order), characters split over tokens
    merged onto the token that completes them; a token holding only earlier bytes of one reads ◌."""
    merged = merge_tokens(["" if t is None or pd.isna(t) else str(t) for t in texts])
    return [CONTINUATION if t is None else display_token(t) for t in merged]


def _token_texts(df: pd.DataFrame) -> list:
    return list(df[TOK.token]) if TOK.token in df.columns else [""] * len(df)


def hover_text(row: pd.Series, columns) -> str:
    """'name value' lines of every recorded value of one token (floats in 4 significant digits)."""
    lines = [f"token '{cap_text(visible_text(cap_text(str(row.get(TOK.token, '')))))}'"]
    for c in columns:
        v = row.get(c)
        if v is None or pd.isna(v):
            continue
        lines.append(f"{c} {v:.4g}" if isinstance(v, (float, np.floating)) else f"{c} {v}")
    return "\n".join(lines)


def with_push(tokens: pd.DataFrame) -> pd.DataFrame:
    """The tokens with column push = -coef (PUSH: > 0 pushed up by the update, < 0 pushed down)."""
    if TOK.coef not in tokens.columns:
        return tokens
    return tokens.assign(**{PUSH: -pd.to_numeric(tokens[TOK.coef], errors="coerce")})


def with_gap(tokens: pd.DataFrame) -> pd.DataFrame:
    """The tokens with column rollout_gap = old_logprob - rollout_logprob (GAP; NaN where the engine gave
    no log-prob): > 0 where the engine gave the token less mass than the trainer."""
    if TOK.rollout_logprob not in tokens.columns or TOK.old_logprob not in tokens.columns:
        return tokens
    old = pd.to_numeric(tokens[TOK.old_logprob], errors="coerce")
    return tokens.assign(**{GAP: old - pd.to_numeric(tokens[TOK.rollout_logprob], errors="coerce")})


def _hover_columns(df: pd.DataFrame) -> list[str]:
    extra = [c for c in df.columns if c not in HOVER_COLUMNS and c not in _KEYS]
    return [c for c in HOVER_COLUMNS if c in df.columns] + extra


def _check(tokens: pd.DataFrame, color_by: str) -> pd.DataFrame:
    if color_by not in tokens.columns:
        raise ValueError(f"cannot colour by {color_by!r}: not a column; columns: {sorted(tokens.columns)}")
    return tokens.sort_values(TOK.position, kind="stable") if TOK.position in tokens.columns else tokens


def token_html(
    tokens: pd.DataFrame, color_by: str = TOK.prob, *, vmin: float | None = None, vmax: float | None = None
) -> str:
    """An HTML fragment: the completion's tokens as coloured spans, every recorded value in the tooltip.

    Tokens outside the loss (in_loss False, e.g. tool output) are drawn faded. Text is HTML-escaped.
    """
    df = _check(tokens, color_by)
    colors = token_colors(df[color_by], color_by, vmin, vmax)
    cols = _hover_columns(df)
    spans = []
    merged = merge_tokens(["" if t is None or pd.isna(t) else str(t) for t in _token_texts(df)])
    for (_, row), bg, part in zip(df.iterrows(), colors, merged):
        text = _html.escape(CONTINUATION if part is None else display_token(part))
        if "↵" in text:
            text = text.replace("↵", "↵<br>")
        faded = "opacity:0.45;" if _not_in_loss(row) else ""
        style = f"background:{bg or 'transparent'};color:{_text_color(bg)};{faded}{BOUNDARY}"
        title = _html.escape(hover_text(row, cols) + (PART_NOTE if part is None else ""), quote=True)
        spans.append(f'<span class="tg-tok" style="{style}" title="{title}">{text}</span>')
    lo, hi = color_range(df[color_by], color_by, vmin, vmax)
    return (
        f'<div class="tg-tokens" style="font-family:monospace;white-space:pre-wrap;line-height:1.9">'
        f"{''.join(spans)}</div>{_legend_html(color_by, lo, hi)}"
    )


# every token a visible box: where one token ends and the next begins reads at a glance
BOUNDARY = "border:1px solid rgba(0,0,0,0.28);border-radius:3px;padding:0 1px;margin:0 1px 0 0"


def _not_in_loss(row: pd.Series) -> bool:
    v = row.get(TOK.in_loss)
    return v is not None and not pd.isna(v) and not bool(v)


def _legend_html(column: str, lo: float, hi: float) -> str:
    stops = ",".join(token_colors(np.linspace(lo, hi, 7), column, lo, hi))
    left, right = (
        (f"{PUSH_ENDS[0]} ({lo:.3g})", f"({hi:.3g}) {PUSH_ENDS[1]}")
        if column == PUSH
        else (
            f"{lo:.3g}",
            f"{hi:.3g}",
        )
    )
    name = "−coef" if column == PUSH else column
    return (
        f'<div class="tg-legend" style="font-size:0.8em;margin-top:4px">{_html.escape(name)}: '
        f'{_html.escape(left)} <span style="display:inline-block;width:120px;height:0.8em;'
        f'vertical-align:middle;background:linear-gradient(to right,{stops})"></span> '
        f"{_html.escape(right)}</div>"
    )


def _colorbar(column: str, lo: float, hi: float) -> dict:
    if column != PUSH:
        return dict(title=column)
    return dict(title="−coef", tickvals=[lo, 0.0, hi], ticktext=[PUSH_ENDS[0], "0", PUSH_ENDS[1]])


def make_token_figure(
    tokens: pd.DataFrame,
    color_by: str = TOK.prob,
    *,
    per_row: int = 16,
    vmin: float | None = None,
    vmax: float | None = None,
    title: str | None = None,
) -> go.Figure:
    """The completion as a heatmap of `per_row` tokens per row, cell colour = `color_by`, text = token."""
    if tokens.empty:
        return empty_figure("no tokens recorded for this completion", title)
    df = _check(tokens, color_by)
    n = len(df)
    rows = -(-n // per_row)
    pad = rows * per_row - n

    def grid(values, fill):
        return np.concatenate([np.asarray(values, dtype=object), np.full(pad, fill, dtype=object)]).reshape(
            rows, per_row
        )

    z = grid(df[color_by].astype(float), None)
    text = grid(display_tokens(_token_texts(df)), "")
    cols = _hover_columns(df)
    hover = grid([hover_text(r, cols).replace("\n", "<br>") for _, r in df.iterrows()], "")
    lo, hi = color_range(df[color_by], color_by, vmin, vmax)
    fig = go.Figure(
        go.Heatmap(
            z=z,
            text=text,
            texttemplate="%{text}",
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            colorscale=COLOR_SCALES.get(color_by, "YlOrRd"),
            zmin=lo,
            zmax=hi,
            xgap=2,
            ygap=2,
            colorbar=_colorbar(color_by, lo, hi),
        )
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, autorange="reversed")
    return dashboard_layout(fig, title, height=max(160, 34 * rows + 80))
