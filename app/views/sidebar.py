"""The sidebar every page shares: runs folder, run picker, live refresh and the download format.

The chosen run directories go to Session State (key RUNS_KEY); pages read them with
`app.views.common.selected_runs()`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import streamlit as st

from app import data
from tokengrad.dashboard import ALLOW_ANY_FLAG, confine, resolve_root

ROOT_KEY = "tg_root"
RUNS_KEY = "tg_runs"
PICK_KEY = "tg_pick"
LIVE_KEY = "tg_live"
EVERY_KEY = "tg_live_every"
FORMAT_KEY = "tg_download_format"
_SIG_KEY = "tg_live_signature"
DEFAULT_PICK = 4  # runs shown at first: enough to compare, few enough to read
LIVE_INTERVALS_S = (2, 5, 10, 30)
DOWNLOAD_FORMATS = ("png", "svg", "html")


def _script_args(argv: list[str]) -> argparse.Namespace:
    """`--root DIR [--allow-any-folder]` from the script arguments (`streamlit run app/streamlit_app.py --
    --root DIR`)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--root", default=None)
    parser.add_argument(ALLOW_ANY_FLAG, action="store_true")
    return parser.parse_known_args(argv)[0]


def root_from_argv(argv: list[str]) -> str | None:
    return _script_args(argv).root


def _root_ui() -> str | None:
    """The folder typed in the box, if the served root holds it (or the server allows any folder)."""
    args = _script_args(sys.argv[1:])
    served = resolve_root(args.root)
    if ROOT_KEY not in st.session_state:
        st.session_state[ROOT_KEY] = str(served)
    typed = st.text_input(
        "Runs folder", key=ROOT_KEY, help=f"A folder of run directories, or one run directory, in {served}."
    )
    try:
        return str(confine(typed, served, args.allow_any_folder))
    except ValueError as err:
        st.error(str(err))
        return None


def _runs_ui(root: str) -> list[str]:
    runs = data.runs_under(root)
    if not runs:
        st.session_state[RUNS_KEY] = []
        st.caption(f"No runs (folders with meta.json) in `{root}`.")
        return []
    by_name = {Path(r).name: r for r in runs}
    names = list(by_name)
    current = [n for n in st.session_state.get(PICK_KEY, names[:DEFAULT_PICK]) if n in by_name]
    st.session_state[PICK_KEY] = current  # drop runs that vanished from the folder
    picked = st.multiselect(
        "Runs",
        names,
        key=PICK_KEY,
        help="Pick several runs to overlay them; a run keeps its colour on every page.",
    )
    st.session_state[RUNS_KEY] = [by_name[n] for n in picked]
    return st.session_state[RUNS_KEY]


def _watch(run_dirs: list[str]) -> None:
    """Poll the runs' file signatures; rerun the whole app only when a file changed.

    Runs as a fragment with run_every (see _live_ui), so a poll redraws only this caption. The cached
    loaders are keyed on the same signatures, so the app rerun re-reads only the tables that changed."""
    sig = data.live_signature(run_dirs)
    if st.session_state.get(_SIG_KEY) != sig:
        st.session_state[_SIG_KEY] = sig
        st.rerun(scope="app")
    st.caption(f"checked {time.strftime('%H:%M:%S')}")


def _live_ui(run_dirs: list[str]) -> None:
    live = st.toggle("Live refresh", key=LIVE_KEY, help="Re-read runs that are still being written.")
    if not live or not run_dirs:
        return
    every = st.select_slider("every (s)", LIVE_INTERVALS_S, value=5, key=EVERY_KEY)
    st.session_state[_SIG_KEY] = data.live_signature(run_dirs)  # this run already shows these files
    st.fragment(_watch, run_every=every)(run_dirs)


def render() -> None:
    with st.sidebar:
        st.markdown("### tokengrad")
        root = _root_ui()
        if root is None:
            st.session_state[RUNS_KEY] = []
        run_dirs = _runs_ui(root) if root else []
        _live_ui(run_dirs)
        st.radio(
            "Download charts as",
            DOWNLOAD_FORMATS,
            key=FORMAT_KEY,
            horizontal=True,
            help="PNG and SVG need chromium (kaleido); without it the download is interactive HTML.",
        )
