"""The first page of a dashboard started where there are no runs: `tokengrad dashboard` without a folder,
in a folder with no run below it, serves the demo run shipped inside the package (tokengrad/demo) and says,
above every page, how to record a run of one's own.
"""

from __future__ import annotations

import sys

import streamlit as st

from tokengrad.app.views.sidebar import no_runs_in

RECORD_WAYS = (
    "your own loop: `with Recorder(run_dir, model=model) as rec:` and `st.track(logprobs, ...)` in each "
    "`rec.step(step)` (README, Quickstart 1)",
    "TRL: `attach(trainer, run_dir)` from `tokengrad.integrations.trl` before `trainer.train()`",
    "the built-in trainer: `tokengrad train CONFIG` (`tokengrad train --help` lists every key)",
)


def message(folder: str) -> str:
    """What the banner says: where no run was found, the demo shown instead, and how to record a run."""
    ways = "\n".join(f"- {way}" for way in RECORD_WAYS)
    return (
        f"**No runs under `{folder}`.** This is the demo run shipped with tokengrad (8 steps of GRPO on "
        f"SmolLM2-135M). Record a run of your own with\n\n{ways}\n\nthen start `tokengrad dashboard` in the "
        "folder that holds it, or `tokengrad dashboard RUNS_FOLDER`."
    )


def render() -> None:
    """The banner, when the served runs are the demo standing in for a folder without runs."""
    folder = no_runs_in(sys.argv[1:])
    if folder:
        st.info(message(folder), icon=":material/info:")
