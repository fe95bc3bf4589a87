"""Evaluation: held-out accuracy by difficulty per run, and over training steps."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common, hints
from tokengrad.figures.evals import make_accuracy_by_difficulty_figure, make_accuracy_over_steps_figure
from tokengrad.schema import EVAL


def shared_tasks(evals: dict[str, pd.DataFrame]) -> list[str]:
    """The evaluated tasks, the one most picked runs share first (ties: by name)."""
    runs_per_task = Counter(str(t) for df in evals.values() for t in set(df[EVAL.task].dropna()))
    return sorted(runs_per_task, key=lambda t: (-runs_per_task[t], t))


def _task_ui(evals: dict[str, pd.DataFrame]) -> str | None:
    tasks = shared_tasks(evals)
    if len(tasks) <= 1:
        return tasks[0] if tasks else None
    if st.session_state.get("ev_task") not in tasks:  # first visit, or other runs: the most shared task
        st.session_state["ev_task"] = tasks[0]
    return st.selectbox("Task", tasks, key="ev_task", help="Ordered by how many of the picked runs have it.")


def render() -> None:
    st.title("Evaluation")
    runs = common.require_runs()
    with common.guard("Evaluation"):
        evals = {common.run_name(r): data.table(r, "evals") for r in runs}
        for r in runs:
            if evals[common.run_name(r)].empty:
                common.empty(f"No evaluations in {common.run_name(r)}.", hints.hint(data.meta(r), "evals"))
        evals = {n: df for n, df in evals.items() if not df.empty}
        if evals:
            task = _task_ui(evals)
            common.chart(
                make_accuracy_by_difficulty_figure(
                    evals,
                    task=task,
                    colors=common.colors(),
                    title="Accuracy by difficulty (last evaluation of each run)",
                ),
                "ev_diff",
                "accuracy_by_difficulty",
            )
            by_diff = st.toggle("One panel per difficulty", value=False, key="ev_by_diff")
            common.chart(
                make_accuracy_over_steps_figure(
                    evals,
                    task=task,
                    colors=common.colors(),
                    by_difficulty=by_diff,
                    title="Accuracy over training",
                ),
                "ev_steps",
                "accuracy_over_steps",
            )
    common.show_run_warnings(runs)


render()
