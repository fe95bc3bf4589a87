"""The doctor's statistics: robust z-scores, monotone trends and sustained thresholds (numpy and the
standard library only).

    robust_z(x)                      # 0.6745 (x - median) / MAD (Iglewicz & Hoaglin 1993), NaN where no scale
    trend(y)                         # Mann-Kendall test (Kendall's tau of y against time) + Theil-Sen slope
    sustained(mask, k)               # first index of the first run of >= k consecutive True values
    runs_of(mask)                    # (start, stop) of every run of True values
    kendall_tau(x, y)                # tau-b and two-sided p-value, as scipy.stats.kendalltau
    sign_test_greater(k, n)          # exact P(X >= k), X ~ Binomial(n, 1/2), as scipy.stats.binomtest

Everything is deterministic and skips NaN; a detector decides on these numbers and reports them as its
evidence. The tests hold kendall_tau, the Theil-Sen slope, spearman and sign_test_greater equal to
scipy.stats (kendalltau, theilslopes, spearmanr, binomtest): importing scipy.stats takes over a second,
which the dashboard's first page, which runs the doctor, would pay on every cold start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tokengrad.doctor.spike_rule import MAD_Z, robust_z  # noqa: F401 - the doctor's statistics in one place

_INVERSION_BLOCK = 1024  # elements compared pairwise at once when counting discordant pairs


@dataclass(frozen=True, kw_only=True)
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
    """Mann-Kendall (kendall_tau against x) and Theil-Sen (theil_sen_slope) of the finite points of
    `values`; x defaults to 0..n-1 (pass steps for a slope per step)."""
    y = np.asarray(values, dtype=float)
    t = np.arange(y.size, dtype=float) if x is None else np.asarray(x, dtype=float)
    keep = np.isfinite(y) & np.isfinite(t)
    y, t = y[keep], t[keep]
    if y.size < 3 or np.all(y == y[0]):
        return Trend(tau=0.0, p_value=1.0, slope=0.0, n=int(y.size))
    tau, p = kendall_tau(t, y)
    slope = theil_sen_slope(y, t)
    return Trend(tau=float(tau), p_value=float(p), slope=float(slope), n=int(y.size))


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
    return float(np.corrcoef(np.vstack([_average_ranks(a), _average_ranks(b)]))[1, 0])


def kendall_tau(x, y) -> tuple[float, float]:
    """Kendall's tau-b of the pairs and its two-sided p-value (Kendall 1970, "Rank Correlation Methods").
    The p-value is exact (the permutation distribution of the number of discordant pairs) when neither side
    has ties and n <= 33 or at most one pair is out of order, else from the normal approximation of the
    statistic S = concordant - discordant with the tie-corrected variance; the same choice as
    scipy.stats.kendalltau's default, which the tests hold it to. NaN, NaN when a side is constant/empty."""
    x, y = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    if x.size != y.size:
        raise ValueError(f"x and y differ in length: {x.size} != {y.size}")
    n = int(x.size)
    tx, ty = _tie_groups(x), _tie_groups(y)  # sizes of the groups of equal values
    pairs = n * (n - 1) // 2
    x_tied, y_tied = _tied_pairs(tx), _tied_pairs(ty)
    if n == 0 or x_tied == pairs or y_tied == pairs:
        return float("nan"), float("nan")
    s = _kendall_s(x, y, x_tied)
    tau = float(np.clip(s / math.sqrt((pairs - x_tied) * (pairs - y_tied)), -1.0, 1.0))
    discordant = (pairs - s) // 2  # without ties: concordant + discordant = pairs
    if not x_tied and not y_tied and (n <= 33 or min(discordant, pairs - discordant) <= 1):
        return tau, _kendall_p_exact(n, min(discordant, pairs - discordant))
    var = _kendall_s_variance(n, tx, ty)
    return tau, math.erfc(abs(s) / math.sqrt(2.0 * var))  # 2 (1 - Phi(|S| / sd))


def _tie_groups(a: np.ndarray) -> np.ndarray:
    """Sizes (int64) of the groups of equal values with more than one member."""
    counts = np.unique(a, return_counts=True)[1].astype(np.int64)
    return counts[counts > 1]


def _tied_pairs(groups: np.ndarray) -> int:
    return int((groups * (groups - 1) // 2).sum())


def _kendall_s(x: np.ndarray, y: np.ndarray, x_tied: int) -> int:
    """S = sum over pairs i < j of sign(x_j - x_i) sign(y_j - y_i). Without ties in x (a trend over time),
    in x order S = (pairs not tied in y) - 2 (pairs in descending y), the descending ones counted by binary
    search against the sorted earlier values, a block at a time: O(n log n). With ties in x: every pair's
    signs, a block of rows at a time (O(n^2) work)."""
    n = x.size
    if x_tied:
        s = 0
        for a in range(0, n, _INVERSION_BLOCK):
            dx = np.sign(x[a : a + _INVERSION_BLOCK, None] - x[None, :])  # [B, n]
            dy = np.sign(y[a : a + _INVERSION_BLOCK, None] - y[None, :])
            s += int((dx * dy).sum())
        return s // 2  # every pair was counted from both ends
    ys = y[np.argsort(x, kind="stable")]
    descending = 0
    for a in range(0, n, _INVERSION_BLOCK):
        block = ys[a : a + _INVERSION_BLOCK]
        earlier = np.sort(ys[:a])
        descending += int((earlier.size - np.searchsorted(earlier, block, side="right")).sum())
        descending += int(np.triu(block[:, None] > block[None, :], 1).sum())  # pairs inside the block
    return n * (n - 1) // 2 - _tied_pairs(_tie_groups(y)) - 2 * descending


def _kendall_s_variance(n: int, tx: np.ndarray, ty: np.ndarray) -> float:
    """Var(S) under independence with ties in both rankings (Kendall 1970, eq. 4.3)."""
    tx, ty = tx.astype(float), ty.astype(float)
    v0 = n * (n - 1.0) * (2 * n + 5)
    vx, vy = (tx * (tx - 1) * (2 * tx + 5)).sum(), (ty * (ty - 1) * (2 * ty + 5)).sum()
    v1 = (tx * (tx - 1)).sum() * (ty * (ty - 1)).sum() / (2 * n * (n - 1.0))
    v2 = (tx * (tx - 1) * (tx - 2)).sum() * (ty * (ty - 1) * (ty - 2)).sum() / (9 * n * (n - 1.0) * (n - 2))
    return (v0 - vx - vy) / 18 + v1 + (v2 if n > 2 else 0.0)


def theil_sen_slope(y, x) -> float:
    """The Theil-Sen slope (Sen 1968): the median of the slopes between every pair with distinct x, as
    scipy.stats.theilslopes(y, x).slope."""
    y, x = np.asarray(y, dtype=float).ravel(), np.asarray(x, dtype=float).ravel()
    dx = x[:, np.newaxis] - x
    dy = y[:, np.newaxis] - y
    up = dx > 0
    return float(np.median(dy[up] / dx[up]))


def sign_test_greater(k: int, n: int) -> float:
    """The exact one-sided sign test: P(X >= k) for X ~ Binomial(n, 1/2), as
    scipy.stats.binomtest(k, n, 0.5, alternative="greater").pvalue (computed in rationals)."""
    if not 0 <= k <= n:
        raise ValueError(f"k must lie in [0, n]: k={k}, n={n}")
    return float(Fraction(sum(math.comb(n, i) for i in range(k, n + 1)), 2**n))


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """Ranks 1..n, equal values sharing the mean of the ranks they span."""
    _, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts  # 0-based position where each distinct value starts
    return (first + (counts + 1) / 2.0)[inverse]


def _kendall_p_exact(n: int, c: int) -> float:
    """Two-sided exact p-value of c (the smaller of discordant and concordant) among n untied points:
    2 P(D <= c), D = the inversions of a uniformly random permutation of n, whose counts are the Mahonian
    numbers M(m, k) = sum_{j < m} M(m - 1, k - j); exact integers, capped at 1."""
    counts = [1] + [0] * c  # M(1, k), k = 0..c
    for m in range(2, n + 1):
        prefix = np.cumsum([0, *counts], dtype=object)  # prefix[k + 1] = sum of counts[0..k]
        counts = [prefix[k + 1] - prefix[max(0, k - m + 1)] for k in range(c + 1)]
    return min(1.0, 2 * sum(counts) / math.factorial(n))


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
