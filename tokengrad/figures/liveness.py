"""Steps without a gradient ("dead" steps) as a state of their own, not as data.

A GRPO step whose groups all got one reward each has every advantage 0, so every loss coefficient
coef = dL/dlog pi is 0 and the step's gradient is exactly 0 (GRPO, arXiv 2402.03300 Eq. 3: A_i = (r_i -
mean r) / std r). Plotted as data, such steps plunge to the floor of a log axis, drag a smoothed curve
down and make the coefficient of variation and the spike detector describe the zeros instead of training.
Every figure and summary therefore splits the steps first:

    live = live_mask(grad_norms)          # True where the step's pre-clip gradient norm is > 0
    dead_note(n_dead, n_steps)            # "3 of 40 steps had no gradient"

A norm that was not recorded (NaN) is missing, not dead.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.schema import STEP

LIVE_HELP = (
    "Computed over live steps only: steps whose gradient norm is 0 (every advantage 0, e.g. all "
    "completions of every group got the same reward) are left out."
)


def live_mask(values) -> np.ndarray:
    """True where a recorded gradient norm is > 0 (+inf counts as live: it is a real, broken gradient)."""
    x = np.asarray(values, dtype=float)
    return ~np.isnan(x) & (x > 0)


def dead_mask(values) -> np.ndarray:
    """True where a recorded gradient norm is exactly 0 (NaN, i.e. not recorded, is neither live nor dead)."""
    x = np.asarray(values, dtype=float)
    return x == 0


def dead_steps(series: pd.DataFrame, column: str = STEP.grad_norm) -> list[int]:
    """Steps of a [step, column] series whose value is 0."""
    if series.empty or column not in series.columns:
        return []
    return [int(s) for s in series[STEP.step].to_numpy()[dead_mask(series[column])]]


def dead_note(n_dead: int, n_steps: int) -> str:
    """'k of n steps had no gradient' (the count shown next to every trajectory and in the summary)."""
    return f"{n_dead} of {n_steps} step{'s' if n_steps != 1 else ''} had no gradient"


def count_note(series: pd.DataFrame, column: str = STEP.grad_norm) -> str:
    """dead_note of a [step, column] series (steps with a recorded value)."""
    if series.empty or column not in series.columns:
        return dead_note(0, 0)
    recorded = series[column].notna()
    return dead_note(int(dead_mask(series[column]).sum()), int(recorded.sum()))
