"""A figure's data as a table: what the dashboard's "CSV" download of every chart holds.

    figure_table(make_grad_norm_figure(...)).to_csv("grad_norm.csv", index=False)

One row per plotted point, in long form: the trace's name, its panel (x/y axis ids for small multiples),
x, y, and for heatmaps z. Hidden helper traces (the dead-step ticks' 0..1 positions) keep their name, so
the table says "grpo: 3 of 40 steps had no gradient" at those steps. Image traces (word clouds) hold
pixels, not data: the caller passes the frequencies instead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

TABLE_COLUMNS = ("trace", "panel", "x", "y")


def _values(v, n: int) -> np.ndarray:
    if v is None:
        return np.full(n, np.nan, dtype=object)
    arr = np.asarray(v, dtype=object)
    return arr if arr.size == n else np.full(n, np.nan, dtype=object)


def _heatmap_rows(trace) -> pd.DataFrame:
    z = np.asarray(trace.z, dtype=object)  # [rows, cols]
    ys = np.asarray(trace.y if trace.y is not None else np.arange(z.shape[0]), dtype=object)
    xs = np.asarray(trace.x if trace.x is not None else np.arange(z.shape[1]), dtype=object)
    values = np.asarray(trace.customdata, dtype=object) if trace.customdata is not None else z
    if values.shape != z.shape:
        values = z
    return pd.DataFrame({"x": np.tile(xs, len(ys)), "y": np.repeat(ys, len(xs)), "z": values.reshape(-1)})


def _trace_rows(trace) -> pd.DataFrame | None:
    if trace.type == "image":
        return None
    if trace.type == "heatmap":
        rows = _heatmap_rows(trace)
    else:
        x = trace.x if trace.x is not None else trace.y
        if x is None:
            return None
        n = len(x)
        rows = pd.DataFrame({"x": _values(x, n), "y": _values(trace.y, n)})
    rows.insert(0, "panel", f"{getattr(trace, 'xaxis', None) or 'x'}/{getattr(trace, 'yaxis', None) or 'y'}")
    rows.insert(0, "trace", trace.name or trace.type)
    return rows


def figure_table(fig: go.Figure) -> pd.DataFrame:
    """Every data point of the figure's traces in long form (columns trace, panel, x, y[, z])."""
    frames = [r for r in (_trace_rows(t) for t in fig.data) if r is not None and len(r)]
    if not frames:
        return pd.DataFrame(columns=list(TABLE_COLUMNS))
    return pd.concat(frames, ignore_index=True)
