"""The sidebar every page shares: runs folder, run picker, live refresh and the download format.

The chosen run directories go to Session State (key RUNS_KEY); pages read them with
`app.views.common.selected_runs()`. The picked runs' chips wear the run's colour (the one every chart
gives it), and the picked runs are in the URL (urlstate). Live refresh watches the runs folder too: a run
folder that appears while the page is open is listed and picked.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import urlstate
from tokengrad.figures.style import run_colors
from tokengrad.read import meta_file
from tokengrad.read.remote import is_url
from tokengrad.read.runs import with_meta_name
from tokengrad.read.served_root import ALLOW_ANY_FLAG, NO_RUNS_FLAG, open_folder, resolve_root

ROOT_KEY = "tg_root"
SERVED_KEY = "tg_root_open"  # the resolved folder the run names are relative to
RUNS_KEY = "tg_runs"
PICK_KEY = "tg_pick"
LIVE_KEY = "tg_live"
EVERY_KEY = "tg_live_every"
FORMAT_KEY = "tg_download_format"
_SIG_KEY = "tg_live_signature"
_KNOWN_KEY = "tg_known_runs"
_CAPPED_KEY = "tg_runs_capped"  # (runs asked for, the first MAX_RUNS of them) when a pick was cut
DEFAULT_PICK = 4  # runs shown at first: enough to compare, few enough to read
MAX_RUNS = 12  # runs compared at once: each keeps a colour of its own (figures.style.RUN_PALETTE has 12)
LIVE_INTERVALS_S = (2, 5, 10, 30)
DOWNLOAD_FORMATS = ("png", "svg", "html")


def _script_args(argv: list[str]) -> argparse.Namespace:
    """`--root DIR [--allow-any-folder] [--no-runs-in DIR]` from the script arguments (`streamlit run
    tokengrad/app/streamlit_app.py -- --root DIR`)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--root", default=None)
    parser.add_argument(ALLOW_ANY_FLAG, action="store_true")
    parser.add_argument(NO_RUNS_FLAG, dest="no_runs_in", default=None)
    return parser.parse_known_args(argv)[0]


def root_from_argv(argv: list[str]) -> str | None:
    return _script_args(argv).root


def no_runs_in(argv: list[str]) -> str | None:
    """The folder without runs that the served demo run stands in for (`tokengrad dashboard` started
    without a folder where none lies below), else None."""
    return _script_args(argv).no_runs_in


def _root_ui() -> str | None:
    """The folder typed in the box, if the served root holds it (or the server allows any folder)."""
    args = _script_args(sys.argv[1:])
    served = resolve_root(args.root)
    if args.root and is_url(args.root):  # a bucket prefix: served from its local copy, kept fresh
        problem = data.refresh_bucket(args.root)
        if problem:
            st.error(problem)
    if ROOT_KEY not in st.session_state:
        st.session_state[ROOT_KEY] = str(served)
    typed = st.text_input(
        "Runs folder",
        key=ROOT_KEY,
        help=f"A folder of run directories (searched 3 levels deep), or one run directory, in {served}; "
        "a relative name is taken inside it.",
    )
    try:
        return str(open_folder(typed, served, args.allow_any_folder))
    except ValueError as err:
        st.error(str(err))
        return None


def _runs_ui(root: str) -> list[str]:
    runs = data.runs_under(root)
    if not runs:
        st.session_state[RUNS_KEY] = []
        st.caption(f"No runs (folders with meta.json) in `{root}`.")
        return []
    st.session_state[SERVED_KEY] = root
    by_name = {run_label(r, root): r for r in runs}
    names = list(by_name)
    known = st.session_state.get(_KNOWN_KEY)
    new = [n for n in names if known is not None and n not in known]  # appeared since the last run
    st.session_state[_KNOWN_KEY] = names
    picked = st.session_state[PICK_KEY] if PICK_KEY in st.session_state else first_pick(by_name)
    picked = list(dict.fromkeys([n for n in picked if n in by_name] + new))  # drop vanished, add new runs
    if len(picked) > MAX_RUNS:  # a URL can name any number of runs; the note stays while they are shown
        st.session_state[_CAPPED_KEY] = (len(picked), picked[:MAX_RUNS])
    st.session_state[PICK_KEY] = picked[:MAX_RUNS]
    picked = st.multiselect(
        "Runs",
        names,
        key=PICK_KEY,
        max_selections=MAX_RUNS,
        help=f"Pick up to {MAX_RUNS} runs to overlay them; a run keeps its colour on every page.",
    )
    asked, shown = st.session_state.get(_CAPPED_KEY, (0, None))
    if shown == picked:
        st.caption(
            f"Showing the first {MAX_RUNS} of the {asked} runs asked for: at most {MAX_RUNS} are compared."
        )
    _chip_colors(picked)
    st.session_state[RUNS_KEY] = [by_name[n] for n in picked]
    return st.session_state[RUNS_KEY]


def run_label(run_dir: str, root: str | None = None) -> str:
    """A run's name on every chart and table: its path below the runs folder ('sweep/seed0'), else its
    folder name."""
    root = root or st.session_state.get(SERVED_KEY)
    path = Path(run_dir)
    if root:
        try:  # not resolved: a symlinked run keeps its own name
            rel = path.relative_to(root)
            if rel.parts:
                return rel.as_posix()
        except ValueError:
            pass
    return path.name


def run_title(run_dir: str) -> str:
    """run_label, with the name meta.json gives the run beside it where that differs (a copied folder):
    'copy (run_name lab_grpo)'. Cards and tables show it; links and URL state carry run_label."""
    try:
        meta_name = meta_file.run_name(data.meta(run_dir))
    except data.RunLoadError:
        meta_name = None
    return with_meta_name(run_label(run_dir), meta_name)


def folder_run_names() -> list[str]:
    """Names of every run listed in the runs folder (what the run colours are assigned over)."""
    return list(st.session_state.get(_KNOWN_KEY) or [])


def first_pick(by_name: dict[str, str]) -> list[str]:
    """The runs a first visit shows: the largest family of runs (same task and length, meta_file.family;
    ties: the family of the first run by name), at most DEFAULT_PICK of them."""
    families: dict[tuple, list[str]] = {}
    for name, run_dir in by_name.items():
        try:
            key = meta_file.family(data.meta(run_dir))
        except data.RunLoadError:
            key = ("unreadable", name)
        families.setdefault(key, []).append(name)
    best = max(families.values(), key=len) if families else []
    return best[:DEFAULT_PICK]


def _chip_colors(picked: list[str]) -> None:
    """Colour the run picker's chips (tags carry the option as aria-label) with the runs' chart colours."""
    colors = run_colors(folder_run_names() + list(picked))
    rules = "".join(
        f'[data-testid="stSidebar"] [data-tag][aria-label="{_css_string(name)}"]'
        f"{{background-color:{colors[name]};color:#fff}}"
        for name in picked
    )
    st.html(f"<style>{rules}</style>")


def _css_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("<", "\\3c ")


def _watch(root: str, run_dirs: list[str]) -> None:
    """Poll the runs folder and the picked runs' file signatures; rerun the whole app only when a file
    changed or a run folder appeared or vanished.

    Runs as a fragment with run_every (see _live_ui), so a poll redraws only this caption. The cached
    loaders are keyed on the same signatures, so the app rerun re-reads only the tables that changed."""
    sig = (tuple(data.runs_under(root)), data.live_signature(run_dirs))
    if st.session_state.get(_SIG_KEY) != sig:
        st.session_state[_SIG_KEY] = sig
        st.rerun(scope="app")
    st.caption(f"checked {time.strftime('%H:%M:%S')}")


def _live_ui(root: str, run_dirs: list[str]) -> None:
    live = st.toggle(
        "Live refresh",
        key=LIVE_KEY,
        help="Re-read runs that are still being written, and list new run folders.",
    )
    if not live:
        return
    every = st.select_slider("every (s)", LIVE_INTERVALS_S, value=5, key=EVERY_KEY)
    # this script run already shows these files and folders
    st.session_state[_SIG_KEY] = (tuple(data.runs_under(root)), data.live_signature(run_dirs))
    st.fragment(_watch, run_every=every)(root, run_dirs)


def render() -> None:
    with st.sidebar:
        st.markdown("### tokengrad")
        urlstate.restore()
        root = _root_ui()
        if root is None:
            st.session_state[RUNS_KEY] = []
        run_dirs = _runs_ui(root) if root else []
        urlstate.push()
        if root:
            _live_ui(root, run_dirs)
        st.radio(
            "Download charts as",
            DOWNLOAD_FORMATS,
            key=FORMAT_KEY,
            horizontal=True,
            help="PNG and SVG need chromium (kaleido); without it the download is interactive HTML.",
        )
