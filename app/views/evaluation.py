"""Evaluation: held-out accuracy by difficulty per run, and over training steps."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import data
from app.views import common
from tokengrad.figures.evals import make_accuracy_by_difficulty_figure, make_accuracy_over_steps_figure
from tokengrad.schema import EVAL

NO_EVALS = (
    "Evaluate with `rec.log_eval(step, task=..., difficulty=..., accuracy=..., n=...)`, or train "
    "with `eval_every=K`."
)


def _task_ui(evals: dict[str, pd.DataFrame]) -> str | None:
    tasks = sorted({str(t) for df in evals.values() for t in df[EVAL.task].dropna().unique()})
    if len(tasks) <= 1:
        return tasks[0] if tasks else None
    return st.selectbox("Task", tasks, key="ev_task")


def render() -> None:
    st.title("Evaluation")
    runs = common.require_runs()
    with common.guard("Evaluation"):
        evals = {common.run_name(r): data.table(r, "evals") for r in runs}
        missing = [n for n, df in evals.items() if df.empty]
        if missing:
            common.empty(f"No evaluations in: {', '.join(missing)}.", NO_EVALS)
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
