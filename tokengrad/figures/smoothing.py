"""Curve smoothing and spike detection for per-step series (pure numpy/pandas).

Smoothing is the debiased exponential moving average of TensorBoard (tensorboard/components/vz_line_chart2/
line-chart.ts; W&B says its EMA matches it, docs.wandb.ai "Smooth line plots"); with weight w in [0, 1),

    last_n = w * last_{n-1} + (1 - w) * x_n,   smoothed_n = last_n / (1 - w^n)

Unrolled, last_n = (1 - w) sum_i w^i x_{n-i} and 1 - w^n = (1 - w) sum_i w^i (i = 0..n-1), so
smoothed_n = sum_i w^i x_{n-i} / sum_i w^i, which is exactly pandas
`Series.ewm(alpha=1 - w, adjust=True).mean()`: the pandas.Series.ewm reference says adjust=True uses the
weights (1 - alpha)^i and divides by their sum. tests/figures/test_figures.py checks it against TensorBoard's
recursion. Non-finite points are skipped the way TensorBoard skips them: ignore_na=True weights by relative
position among the finite points, and the output stays NaN at the skipped points.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Iglewicz & Hoaglin (1993), "How to Detect and Handle Outliers": modified z-score
# M_i = 0.6745 (x_i - median) / MAD, outlier when |M_i| > 3.5. 0.6745 = 1/1.4826 makes MAD estimate
# the standard deviation of normal data. MAD = 0 means more than half of the values are identical: there is
# no robust scale, and the mean-absolute-deviation fallback would call whatever differs from that value (the
# largest steps) a spike, so no step is called a spike then (robust_threshold returns +inf).
MAD_TO_SIGMA = 1.4826
DEFAULT_SPIKE_K = 3.5


def debiased_ema(values, smoothing: float = 0.6) -> np.ndarray:
    """Debiased EMA of a series (TensorBoard smoothing); `smoothing` = w in [0, 1), 0 = no smoothing."""
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    x = pd.Series(np.asarray(values, dtype=float))
    finite = np.isfinite(x.to_numpy())
    x = x.where(finite)  # inf -> NaN, so ewm skips it
    out = x.ewm(alpha=1.0 - smoothing, adjust=True, ignore_na=True).mean().to_numpy(copy=True)
    out[~finite] = np.nan
    return out


def robust_threshold(values, k: float = DEFAULT_SPIKE_K) -> float:
    """median + k * sigma_hat with sigma_hat = 1.4826 * MAD over the finite values.

    Returns +inf when the MAD is 0 (more than half of the values equal the median: no robust scale, so
    nothing is called a spike) or there is no finite value. Callers pass live steps only
    (figures.liveness): a run's dead steps are all 0 and would make the MAD 0.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("inf")
    med = float(np.median(x))
    dev = np.abs(x - med)
    sigma = MAD_TO_SIGMA * float(np.median(dev))
    return med + k * sigma if sigma > 0.0 else float("inf")


def find_spikes(values, k: float = DEFAULT_SPIKE_K) -> np.ndarray:
    """Indices of upward spikes: points with modified z-score 0.6745 (x - median) / MAD above k.

    Applied to the raw series, not the smoothed one: the EMA spreads one spike over the following
    steps (and shrinks it by 1 - w), so raw points locate the step that caused it. +inf is always a
    spike; NaN counts as a missing value.
    """
    x = np.asarray(values, dtype=float)
    threshold = robust_threshold(x, k)
    return np.flatnonzero(np.isposinf(x) | (x > threshold))
