"""Widgets and guards every page uses: the selected runs, charts with image and CSV downloads, warnings.

A page wraps each section in `guard("...")`: a failure there (a corrupt file, a table with unexpected
columns) becomes a warning on that section and the rest of the page is still drawn.
"""

from __future__ import annotations

import contextlib

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from tokengrad.app import data
from tokengrad.app.views.sidebar import FORMAT_KEY, RUNS_KEY, folder_run_names, run_label
from tokengrad.figures.export import figure_to_bytes, find_browser
from tokengrad.figures.style import captions
from tokengrad.figures.tables import figure_table
from tokengrad.read.display import slug

MIME = {"png": "image/png", "svg": "image/svg+xml", "html": "text/html"}
DOWNLOAD_WIDTH, DOWNLOAD_HEIGHT = 1100, 500  # CSS px of a downloaded chart (PNG at 300 dpi scale)


def selected_runs() -> list[str]:
    """Run directories picked in the sidebar."""
    return list(st.session_state.get(RUNS_KEY, []))


def run_name(run_dir: str) -> str:
    """The label of a run on every chart and table: its path below the runs folder (unique within it)."""
    return run_label(run_dir)


def colors() -> dict[str, str]:
    """One colour per run, shared by every chart of every page. The colours are assigned over every run of
    the runs folder (sidebar.folder_run_names), so a run keeps its colour whatever else is picked."""
    from tokengrad.figures.style import run_colors

    picked = [run_name(r) for r in selected_runs()]
    return {n: c for n, c in run_colors(folder_run_names() + picked).items() if n in picked}


def require_runs() -> list[str]:
    """The picked runs that can be opened; stops the page with a hint when there are none."""
    runs = selected_runs()
    if not runs:
        st.info(
            "No run selected. Pick runs in the sidebar, or point the dashboard at a folder of runs: "
            "`tokengrad dashboard runs/`. A run is produced by `tokengrad train ...` or by recording "
            "with `tokengrad.Recorder`."
        )
        st.stop()
    ok = []
    for run_dir in runs:
        try:
            data.meta(run_dir)
            ok.append(run_dir)
        except data.RunLoadError as err:
            st.warning(str(err))
    if not ok:
        st.stop()
    return ok


def pick_one(runs: list[str], key: str, label: str = "Run") -> str:
    """One run out of the selected ones (pages that show a single run)."""
    if len(runs) == 1:
        return runs[0]
    labels = {r: run_name(r) for r in runs}  # computed now: the label depends on the session's folder
    return st.selectbox(label, runs, format_func=labels.get, key=key)


def pick_token_run(runs: list[str], key: str) -> str | None:
    """The single run a token page shows; None (after saying what is missing) when it has no token table."""
    run = pick_one(runs, key)
    lost = lost_note(run, "tokens")
    if lost and not len(data.query(run, "token_steps")):  # files, none of them readable
        st.info(f"No readable token rows in {run_name(run)}.{lost}", icon=":material/info:")
        return None
    if data.has_table(run, "tokens"):
        return run
    from tokengrad.app.views.hints import hint

    empty(f"No token table in {run_name(run)}.", hint(data.meta(run), "tokens"))
    return None


def step_bounds(run_dir: str) -> tuple[int, int] | None:
    """First and last step of the run: from the steps table, else from the token rows."""
    steps = data.table(run_dir, "steps")
    if not steps.empty:
        return int(steps["step"].min()), int(steps["step"].max())
    if data.has_table(run_dir, "tokens"):
        got = data.query(run_dir, "token_steps")
        return (int(got[0]), int(got[-1])) if got else None
    return None


def step_range_ui(run_dir: str, key: str, label: str = "Steps") -> tuple[int, int] | None:
    """A step-range slider over the run's steps; None when the run has fewer than two steps."""
    bounds = step_bounds(run_dir)
    if bounds is None or bounds[0] == bounds[1]:
        return bounds
    lo, hi = st.slider(label, bounds[0], bounds[1], bounds, key=key)
    return int(lo), int(hi)


@contextlib.contextmanager
def guard(what: str):
    """Turn an exception in a page section into a warning naming the section (the page goes on).

    Streamlit's own control flow (st.stop, st.rerun) derives from BaseException and passes through."""
    try:
        yield
    except Exception as err:  # noqa: BLE001 - any data problem must not take the dashboard down
        st.warning(f"{what}: could not be drawn ({type(err).__name__}: {err})")


def download_format() -> str:
    """The sidebar's format, or html when PNG/SVG is asked for but no Chrome/Chromium is installed."""
    fmt = st.session_state.get(FORMAT_KEY, "png")
    return fmt if fmt == "html" or find_browser() else "html"


def chart(fig: go.Figure, key: str, name: str | None = None, table: pd.DataFrame | None = None) -> None:
    """Draw a figure full width, its caption lines (figures.style.captions: e.g. how many steps had no
    gradient) and two download buttons side by side under it: the image (format chosen in the sidebar)
    and its data as CSV (`table`, else every plotted point, figures.tables.figure_table).

    The files are built only when a button is clicked (deferred callables), so a page with many charts
    does not pay for static export (~1-2 s per figure with kaleido) on every rerun."""
    st.plotly_chart(fig, width="stretch", key=f"chart_{key}")
    notes = captions(fig)
    if notes:
        st.caption(" · ".join(notes))
    fmt = download_format()
    size = {"width": DOWNLOAD_WIDTH, "height": fig.layout.height or DOWNLOAD_HEIGHT}
    stem = slug(name or key, "figure")
    image, csv, _ = st.columns([1, 1, 4])  # side by side, under the chart's left edge
    image.download_button(
        f"Download {fmt.upper()}",
        data=lambda: figure_to_bytes(fig, fmt, **size),
        file_name=f"{stem}.{fmt}",
        mime=MIME[fmt],
        key=f"dl_{key}",
        on_click="ignore",
        icon=":material/download:",
        type="tertiary",
    )
    csv.download_button(
        "Download CSV",
        data=lambda: (table if table is not None else figure_table(fig)).to_csv(index=False).encode("utf-8"),
        file_name=f"{stem}.csv",
        mime="text/csv",
        key=f"csv_{key}",
        on_click="ignore",
        icon=":material/table:",
        type="tertiary",
    )


def show_run_warnings(runs: list[str]) -> None:
    """What reading the runs lacks, one box per loss (unreadable files grouped with the steps they held,
    missing rank folders), then the reader's other warnings."""
    for run_dir in runs:
        try:
            lost = [line for _, line in data.losses_for(run_dir)]
            problems = [m for m in data.warnings_for(run_dir) if not data.is_skip_warning(m)]
        except data.RunLoadError as err:
            lost, problems = [], [str(err)]
        for line in lost:
            st.error(f"{run_name(run_dir)}: {line}", icon=":material/broken_image:")
        for msg in problems:
            st.warning(f"{run_name(run_dir)}: {msg}", icon=":material/warning:")


def lost_note(run_dir: str, table: str) -> str:
    """' Its files could not all be read: …' when the table lost files (losses_for), else ''."""
    try:
        lines = [line for t, line in data.losses_for(run_dir) if t == table]
    except data.RunLoadError:
        return ""
    return f" Its files could not all be read: {lines[0]}" if lines else ""


def empty(message: str, how: str) -> None:
    """An empty state: what is missing and how to produce it."""
    st.info(f"{message}  \n{how}", icon=":material/info:")
