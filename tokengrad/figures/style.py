"""One look for every tokengrad figure: run colours, bucket colours, dashboard and paper templates.

    fig = make_metric_figure(...)            # dashboard style
    paper_style(fig, width="column")          # 3.5 in wide, paper fonts, no chrome (tokengrad export)

Sizes are in CSS pixels, 96 per inch, which is how plotly and kaleido measure layout width and height;
PNG export multiplies by PNG_SCALE to reach 300 dpi.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from tokengrad.schema import RESIDUAL_BUCKET

PX_PER_INCH = 96
PNG_DPI = 300
PNG_SCALE = PNG_DPI / PX_PER_INCH
# Paper widths: one column of a two-column paper (~3.5 in) and the full text width (~7 in).
PAPER_WIDTHS = {"column": 3.5, "page": 7.0}
PAPER_ASPECT = {"column": 0.68, "page": 0.36}  # height / width
PAPER_FONT = "DejaVu Sans, Arial, sans-serif"

# Colour-blind-aware palette (Okabe & Ito 2008, then Tol's "muted" set), no yellow on white.
RUN_PALETTE = (
    "#0072B2",
    "#D55E00",
    "#009E73",
    "#CC79A7",
    "#E69F00",
    "#56B4E9",
    "#332288",
    "#882255",
    "#117733",
    "#999933",
    "#AA4499",
    "#44AA99",
)
RESIDUAL_COLOR = "#9E9E9E"
BUCKET_COLORSCALE = "Viridis"


def run_color(run_name: str, palette: tuple[str, ...] = RUN_PALETTE) -> str:
    """A colour for a run that depends only on its name: the same on every page, call and process.

    Uses a cryptographic hash, not hash(), which Python salts per process. Two names can share a
    colour (12 colours); builders accept an explicit `colors` mapping to override.
    """
    digest = hashlib.sha1(str(run_name).encode("utf-8")).digest()
    return palette[int.from_bytes(digest[:4], "big") % len(palette)]


def run_colors(run_names, colors: dict | None = None) -> dict[str, str]:
    """run_name -> colour, `colors` entries taking precedence over run_color().

    Names that would share a colour are resolved by probing the palette from the hashed slot, in sorted
    name order, so runs shown together get distinct colours (up to the palette size) and a run's colour
    depends only on the set of runs shown with it, never on their order.
    """
    colors = dict(colors or {})
    taken = set(colors.values())
    out = {}
    for name in sorted(set(run_names) - set(colors), key=str):
        digest = hashlib.sha1(str(name).encode("utf-8")).digest()
        start = int.from_bytes(digest[:4], "big") % len(RUN_PALETTE)
        for k in range(len(RUN_PALETTE)):
            c = RUN_PALETTE[(start + k) % len(RUN_PALETTE)]
            if c not in taken or len(taken) >= len(RUN_PALETTE):
                break
        out[name] = c
        taken.add(c)
    return {name: colors.get(name, out.get(name)) for name in run_names}


_BUCKET_RE = re.compile(r"^\[\s*([0-9.eE+-]+)\s*,\s*([0-9.eE+-]+)\s*[)\]]$")
BUCKET_SCALE_TOP = 0.9  # the top of Viridis is a pale yellow that does not read on white


def bucket_color(label: str) -> str:
    """The colour of a probability bucket '[lo,hi)': Viridis at its midpoint probability, so a bucket has
    the same colour on every chart whatever other buckets are shown; the residual is grey."""
    if label == RESIDUAL_BUCKET:
        return RESIDUAL_COLOR
    m = _BUCKET_RE.match(str(label))
    if m is None:
        raise ValueError(f"not a probability bucket label '[lo,hi)': {label!r}")
    mid = min(max((float(m.group(1)) + float(m.group(2))) / 2, 0.0), 1.0)
    return sample_colorscale(BUCKET_COLORSCALE, [BUCKET_SCALE_TOP * mid])[0]


def bucket_colors(labels: list[str]) -> dict[str, str]:
    """Probability buckets coloured by their midpoint probability (bucket_color); residual grey."""
    return {b: bucket_color(b) for b in labels}


def _axis(**kw) -> dict:
    return dict(showline=True, linecolor="#444", ticks="outside", zeroline=False, **kw)


DASHBOARD_TEMPLATE = go.layout.Template(
    layout=go.Layout(
        font=dict(size=13),
        plot_bgcolor="white",
        paper_bgcolor="white",
        xaxis=_axis(gridcolor="#EEE"),
        yaxis=_axis(gridcolor="#EEE"),
        hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="left", x=0),
        margin=dict(l=60, r=20, t=60, b=50),
    )
)

# Paper font sizes in CSS px (96 per inch): 11 px = 8.25 pt text, 10 px = 7.5 pt ticks, the smallest that
# stays readable in a 3.5 in column; at most PAPER_NTICKS ticks per axis so labels never collide.
PAPER_FONT_PX, PAPER_TICK_PX, PAPER_NTICKS = 11, 10, 6
PAPER_LEGEND = dict(
    orientation="h",
    yanchor="bottom",
    y=1.02,
    xanchor="left",
    x=0,
    font=dict(size=PAPER_TICK_PX),
    bgcolor="rgba(255,255,255,0)",
)
PAPER_TEMPLATE = go.layout.Template(
    layout=go.Layout(
        font=dict(family=PAPER_FONT, size=PAPER_FONT_PX, color="black"),
        plot_bgcolor="white",
        paper_bgcolor="white",
        xaxis=_axis(gridcolor="#E5E5E5", title=dict(standoff=4), tickfont=dict(size=PAPER_TICK_PX)),
        yaxis=_axis(gridcolor="#E5E5E5", title=dict(standoff=4), tickfont=dict(size=PAPER_TICK_PX)),
        legend=PAPER_LEGEND,
        margin=dict(l=52, r=10, t=30, b=40),
    )
)


def dashboard_layout(fig: go.Figure, title: str | None = None, **layout) -> go.Figure:
    """Apply the dashboard template (in place) and return the figure. A two-line title (a subtitle after
    <br>) gets the room above the legend row it needs. Numbers on every axis are written 1e-4, never with
    SI prefixes (plotly's default reads 1e-4 as "100µ")."""
    if title and "<br>" in title and "margin" not in layout:
        layout["margin"] = dict(t=100)
    fig.update_layout(template=DASHBOARD_TEMPLATE, title=title, **layout)
    fig.update_xaxes(exponentformat="e")
    fig.update_yaxes(exponentformat="e")
    return fig


# ---- captions: what a figure says below itself instead of in its legend --------------------------------
def add_caption(fig: go.Figure, text: str) -> go.Figure:
    """Attach a caption line (e.g. "lab_grpo: 1 of 200 steps had no gradient"); the dashboard prints the
    captions under the chart and `tokengrad export` writes them to captions.md."""
    meta = dict(fig.layout.meta or {}) if isinstance(fig.layout.meta, dict) else {}
    meta["captions"] = [*meta.get("captions", []), text]
    fig.update_layout(meta=meta)
    return fig


def captions(fig: go.Figure) -> list[str]:
    """The figure's caption lines (add_caption), in order."""
    meta = fig.layout.meta
    return list(meta.get("captions", [])) if isinstance(meta, dict) else []


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Tick values and labels written out for a log axis over [lo, hi]: 1, 2, 5 per decade (decades only
    beyond 4 decades), so 0.5 and 5 never both read "5"."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo <= 0 or hi <= 0:
        return [], []
    lo, hi = min(lo, hi), max(lo, hi)
    first, last = int(np.floor(np.log10(lo))), int(np.ceil(np.log10(hi)))
    mantissas = (1,) if last - first > 4 else (1, 2, 5)
    vals = [m * 10.0**e for e in range(first, last + 1) for m in mantissas]
    vals = [v for v in vals if lo / 1.0001 <= v <= hi * 1.0001] or [10.0**first, 10.0**last]
    return vals, [f"{v:.4g}" for v in vals]


def readable_log_axis(fig: go.Figure, values, **selector) -> None:
    """Give the log y axes picked by `selector` (update_yaxes keywords) written-out ticks for `values`."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x) & (x > 0)]
    if x.size:
        vals, text = log_ticks(float(x.min()), float(x.max()))
        fig.update_yaxes(tickvals=vals, ticktext=text, **selector)


def integer_step_axis(fig: go.Figure, steps, **selector) -> None:
    """Whole-number step ticks: every step on a short run (at most 12), else integer labels only."""
    s = np.unique(np.asarray(steps, dtype=float)[np.isfinite(np.asarray(steps, dtype=float))])
    if s.size and s.size <= 12 and np.all(s == np.round(s)):
        fig.update_xaxes(tickmode="linear", tick0=float(s.min()), dtick=1, tickformat="d", **selector)
    else:
        fig.update_xaxes(tickformat="~d", **selector)


def paper_size(width: str = "column", height_in: float | None = None) -> tuple[int, int]:
    """(width, height) in CSS pixels for a paper column or page width."""
    if width not in PAPER_WIDTHS:
        raise ValueError(f"unknown paper width {width!r}; known: {sorted(PAPER_WIDTHS)}")
    w_in = PAPER_WIDTHS[width]
    h_in = height_in if height_in is not None else w_in * PAPER_ASPECT[width]
    return round(w_in * PX_PER_INCH), round(h_in * PX_PER_INCH)


def paper_style(
    fig: go.Figure, width: str = "column", height_in: float | None = None, keep_title: bool = False
) -> go.Figure:
    """A copy of `fig` in the publication style: paper template and size, no title, no dashboard chrome.

    The axis look is also applied with update_xaxes/update_yaxes, because a template's xaxis/yaxis only
    reach the first subplot's axes.
    """
    out = go.Figure(fig)
    w, h = paper_size(width, height_in)
    title = out.layout.title.text
    if title and "<br>" in title:  # a subtitle would be clipped in a column: it becomes a caption
        head, sub = title.split("<br>", 1)
        out.update_layout(title_text=head)
        add_caption(out, re.sub(r"</?sup>", "", sub).strip())
    out.update_layout(
        template=PAPER_TEMPLATE,
        width=w,
        height=h,
        updatemenus=[],
        sliders=[],
        legend=PAPER_LEGEND,
        hovermode="closest",
    )
    legend_px = legend_height(out, w) if out.layout.showlegend is not False else 10
    if keep_title:  # the run's name, above the legend
        out.update_layout(
            title=dict(font=dict(size=PAPER_FONT_PX), x=0.01, xanchor="left", y=0.99, yanchor="top"),
            margin=dict(t=legend_px + 18),
        )
    else:
        out.update_layout(title=None, margin=dict(t=legend_px))
    ticks = dict(
        showline=True,
        linecolor="#444",
        ticks="outside",
        tickfont=dict(size=PAPER_TICK_PX),
        title_font=dict(size=PAPER_FONT_PX),
        nticks=PAPER_NTICKS,
    )
    out.update_xaxes(rangeslider_visible=False, showgrid=False, exponentformat="e", **ticks)  # y grid only
    out.update_yaxes(gridcolor="#E5E5E5", exponentformat="e", **ticks)
    out.update_annotations(font_size=PAPER_FONT_PX)
    return out


def legend_entries(fig: go.Figure) -> list[str]:
    """The names the legend shows (one per legend group)."""
    seen: dict[str, None] = {}
    for t in fig.data:
        if getattr(t, "showlegend", None) is not False and getattr(t, "name", None):
            seen.setdefault(getattr(t, "legendgroup", None) or t.name, None)
    return list(seen)


def legend_height(fig: go.Figure, width_px: int) -> int:
    """Top margin in px for a horizontal paper legend: its rows (entries ~6 px a character plus the
    symbol, wrapped at the figure width) at 14 px each, plus a gap."""
    entries = legend_entries(fig)
    if len(entries) <= 1 and fig.layout.showlegend is not True:
        return 10
    row, rows = 0, 1
    for name in entries:
        need = 6 * len(name) + 40
        if row and row + need > width_px:
            rows, row = rows + 1, 0
        row += need
    return 14 * rows + 14


def center_note(fig: go.Figure, message: str) -> None:
    """A grey note in the middle of the plotting area (why a chart shows nothing to read)."""
    note = dict(showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=14, color="#666"))
    fig.add_annotation(text=message, **note)


def empty_figure(message: str, title: str | None = None) -> go.Figure:
    """A blank figure that says why it is blank (no data recorded, nothing selected)."""
    fig = go.Figure()
    center_note(fig, message)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return dashboard_layout(fig, title)


# A token is drawn with at most this many characters: one pathological token (a 1 MB "word") would
# otherwise fail a word cloud or keep the server busy for minutes.
MAX_TOKEN_CHARS = 40


def cap_text(text: str, limit: int = MAX_TOKEN_CHARS) -> str:
    """`text` cut to `limit` characters, the last one an ellipsis when anything was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
