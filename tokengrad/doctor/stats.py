"""The doctor's statistics: robust z-scores, monotone trends and sustained thresholds (numpy and scipy.stats).

    robust_z(x)                      # 0.6745 (x - median) / MAD (Iglewicz & Hoaglin 1993), NaN where no scale
    trend(y)                         # Mann-Kendall test (Kendall's tau of y against time) + Theil-Sen slope
    sustained(mask, k)               # first index of the first run of >= k consecutive True values
    runs_of(mask)                    # (start, stop) of every run of True values

Everything is deterministic and skips NaN; a detector decides on these numbers and reports them as its
evidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from tokengrad.doctor.spike_rule import MAD_Z, robust_z  # noqa: F401 - the doctor's statistics in one place


@dataclass(frozen=True)
class Trend:
    """A monotone trend of a series over its index: Mann-Kendall's tau and two-sided p-value (the
    Mann-Kendall test is Kendall's tau between the series and time, Kendall 1975) and the Theil-Sen slope
    (median of pairwise slopes, Sen 1968) per index unit."""

    tau: float
    p_value: float
    slope: float
    n: int

    def rising(self, alpha: float) -> bool:
        return self.n >= 3 and self.p_value < alpha and self.tau > 0

    def falling(self, alpha: float) -> bool:
        return self.n >= 3 and self.p_value < alpha and self.tau < 0

    def as_dict(self) -> dict:
        return {"tau": self.tau, "p_value": self.p_value, "theil_sen_slope": self.slope, "n": self.n}


def trend(values, x=None) -> Trend:
    """Mann-Kendall (scipy.stats.kendalltau against x) and Theil-Sen (scipy.stats.theilslopes) of the
    finite points of `values`; x defaults to 0..n-1 (pass steps for a slope per step)."""
    y = np.asarray(values, dtype=float)
    t = np.arange(y.size, dtype=float) if x is None else np.asarray(x, dtype=float)
    keep = np.isfinite(y) & np.isfinite(t)
    y, t = y[keep], t[keep]
    if y.size < 3 or np.all(y == y[0]):
        return Trend(0.0, 1.0, 0.0, int(y.size))
    tau, p = sps.kendalltau(t, y)
    slope = sps.theilslopes(y, t).slope
    return Trend(float(tau), float(p), float(slope), int(y.size))


def runs_of(mask) -> list[tuple[int, int]]:
    """(start, stop) index pairs (stop exclusive) of every run of consecutive True values."""
    m = np.concatenate([[False], np.asarray(mask, dtype=bool), [False]])
    edges = np.flatnonzero(np.diff(m.astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


def sustained(mask, k: int) -> tuple[int, int] | None:
    """The first run of at least k consecutive True values as (start, stop), or None."""
    for a, b in runs_of(mask):
        if b - a >= k:
            return a, b
    return None


def longest_run(mask) -> tuple[int, int] | None:
    """The longest run of True values (the first of equal ones) as (start, stop), or None."""
    runs = runs_of(mask)
    return max(runs, key=lambda r: (r[1] - r[0], -r[0])) if runs else None


def spearman(x, y) -> float:
    """Spearman's rank correlation of the finite pairs (NaN when either side is constant)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if a.size < 3 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    return float(sps.spearmanr(a, b).statistic)


def confidence_from_p(p_value: float) -> float:
    """A confidence in [0, 1] from a p-value: 1 - p (a finding at p = 0.001 has confidence 0.999)."""
    return float(np.clip(1.0 - p_value, 0.0, 1.0))


def confidence_from_excess(value: float, threshold: float, scale: float | None = None) -> float:
    """A confidence in [0.5, 1) that grows with how far `value` passes `threshold`: 0.5 at the threshold,
    1 - 0.5 exp(-excess / scale) beyond it (scale defaults to the threshold's magnitude)."""
    s = abs(threshold) if scale is None else scale
    s = s if s > 0 else 1.0
    excess = max(0.0, abs(value - threshold) / s)
    return float(1.0 - 0.5 * np.exp(-excess))


def sustained_confidence(streak: int, k: int, peak: float, threshold: float) -> float:
    """A confidence for a value above `threshold` for `streak` steps (k needed): 1 - 0.5^(streak / k)
    e^-excess, excess = (peak - threshold) / |threshold| capped at 5. At the bare minimum (streak k, peak
    at the threshold) it is 0.5; it grows with both the length of the streak and how far past it goes."""
    excess = min(5.0, max(0.0, (peak - threshold) / abs(threshold))) if threshold else 5.0
    return float(1.0 - 0.5 ** (streak / k) * np.exp(-excess))
