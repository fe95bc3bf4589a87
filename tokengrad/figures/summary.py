"""The run-summary table: one row per run with its rule, length, final reward, eval accuracy, stability.

    make_summary_table([load_run(p) for p in paths])

A run is anything with `.name`, `.meta`, `.steps`, `.layers`, `.evals` (tokengrad.read.runs.Run).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tokengrad.figures.curves import step_series
from tokengrad.figures.gradnorms import run_grad_norms
from tokengrad.figures.liveness import dead_mask, dead_note, live_mask
from tokengrad.figures.smoothing import DEFAULT_SPIKE_K, find_spikes
from tokengrad.schema import EVAL, STEP

FINAL_FRACTION = 0.1  # "final" reward: mean over the last 10% of steps (at least one step)

SUMMARY_COLUMNS = (
    "run",
    "rule",
    "params",
    "steps",
    "no_gradient",
    "final_reward",
    "eval_accuracy",
    "grad_norm_cv",
    "spikes",
    "spike_steps",
)


def format_params(params: dict | None) -> str:
    """'k=v, k=v' with floats in 4 significant digits, keys sorted."""
    if not params:
        return ""
    fmt = {float: lambda v: f"{v:.4g}"}
    return ", ".join(f"{k}={fmt.get(type(v), str)(v)}" for k, v in sorted(params.items()))


def final_value(values, fraction: float = FINAL_FRACTION) -> float:
    """Mean over the last ceil(fraction * n) values (NaN for an empty series)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return float("nan")
    return float(x[-max(1, int(np.ceil(fraction * x.size))) :].mean())


def final_eval_accuracy(evals: pd.DataFrame) -> float:
    """Accuracy at the last evaluated step, averaged over tasks/difficulties weighted by problem count n."""
    if evals is None or evals.empty:
        return float("nan")
    last = evals[evals[EVAL.step] == evals[EVAL.step].max()]
    n = pd.to_numeric(last[EVAL.n], errors="coerce").fillna(0).to_numpy(dtype=float)
    acc = pd.to_numeric(last[EVAL.accuracy], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(acc)
    if n[ok].sum() > 0:
        return float((acc[ok] * n[ok]).sum() / n[ok].sum())
    return float(acc[ok].mean()) if ok.any() else float("nan")


def coefficient_of_variation(values) -> float:
    """std / mean of the finite values (population std); NaN if the mean is 0 or no values."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0 or x.mean() == 0:
        return float("nan")
    return float(x.std() / x.mean())


def summarize_run(
    name: str,
    meta: dict,
    steps: pd.DataFrame,
    *,
    layers: pd.DataFrame | None = None,
    evals: pd.DataFrame | None = None,
    spike_k: float = DEFAULT_SPIKE_K,
) -> dict:
    """One summary row. Gradient norms come from the layers table's total, else the steps table; the CV
    and the spikes are computed over live steps (figures.liveness), and no_gradient counts the others."""
    weighting = (meta or {}).get("weighting") or {}
    gn = run_grad_norms(layers if layers is not None else pd.DataFrame(), steps)
    values = gn[STEP.grad_norm].to_numpy(dtype=float) if len(gn) else np.array([])
    live = np.flatnonzero(live_mask(values))
    spikes = live[find_spikes(values[live], spike_k)]
    reward = step_series(steps, STEP.reward_mean)
    return {
        "run": name,
        "rule": weighting.get("name", ""),
        "params": format_params(weighting.get("params")),
        "steps": int(steps[STEP.step].nunique()) if len(steps) else 0,
        "no_gradient": dead_note(int(dead_mask(values).sum()), int(np.isfinite(values).sum()))
        if values.size
        else "",
        "final_reward": final_value(reward[STEP.reward_mean]),
        "eval_accuracy": final_eval_accuracy(evals),
        "grad_norm_cv": coefficient_of_variation(values[live]),
        "spikes": int(spikes.size),
        "spike_steps": ", ".join(str(int(s)) for s in gn[STEP.step].to_numpy()[spikes]),
    }


def make_summary_table(runs: Sequence, spike_k: float = DEFAULT_SPIKE_K) -> pd.DataFrame:
    """Summary rows of several runs (objects with name/meta/steps/layers/evals), columns SUMMARY_COLUMNS."""
    rows = [
        summarize_run(r.name, r.meta, r.steps, layers=r.layers, evals=r.evals, spike_k=spike_k) for r in runs
    ]
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
