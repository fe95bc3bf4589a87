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
    """Mann-Kendall (kendall_tau against x) and Theil-Sen (theil_sen_slope) of the finite points of
    `values`; x defaults to 0..n-1 (pass steps for a slope per step)."""
    y = np.asarray(values, dtype=float)
    t = np.arange(y.size, dtype=float) if x is None else np.asarray(x, dtype=float)
    keep = np.isfinite(y) & np.isfinite(t)
    y, t = y[keep], t[keep]
    if y.size < 3 or np.all(y == y[0]):
        return Trend(0.0, 1.0, 0.0, int(y.size))
    tau, p = kendall_tau(t, y)
    slope = theil_sen_slope(y, t)
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
    return float(np.corrcoef(np.vstack([_average_ranks(a), _average_ranks(b)]))[1, 0])


def kendall_tau(x, y) -> tuple[float, float]:
    """Kendall's tau-b of the pairs and its two-sided p-value, as scipy.stats.kendalltau (method "auto"):
    the exact null distribution without ties for n <= 33 (or at most one pair out of order), else the
    normal approximation with the tie-corrected variance (Kendall 1970). NaN, NaN when either side is
    constant or empty. Discordant pairs are counted in blocks (O(n^2 / block) memory, not a Fenwick tree)."""
    x, y = np.asarray(x).ravel(), np.asarray(y).ravel()
    if x.size != y.size:
        raise ValueError(f"x and y differ in length: {x.size} != {y.size}")
    size = int(x.size)
    if not size:
        return float("nan"), float("nan")
    perm = np.argsort(y)  # y to dense ranks, then a stable sort on x: ties in x keep y ascending
    x, y = x[perm], y[perm]
    y = np.r_[True, y[1:] != y[:-1]].cumsum(dtype=np.intp)
    perm = np.argsort(x, kind="mergesort")
    x, y = x[perm], y[perm]
    x = np.r_[True, x[1:] != x[:-1]].cumsum(dtype=np.intp)
    dis = _inversions(y)  # pairs in x order whose y falls: the discordant pairs
    obs = np.r_[True, (x[1:] != x[:-1]) | (y[1:] != y[:-1]), True]
    cnt = np.diff(np.nonzero(obs)[0]).astype(np.int64, copy=False)
    ntie = int((cnt * (cnt - 1) // 2).sum())  # pairs tied in both
    xtie, x0, x1 = _tie_counts(x)
    ytie, y0, y1 = _tie_counts(y)
    tot = (size * (size - 1)) // 2
    if xtie == tot or ytie == tot:
        return float("nan"), float("nan")
    con_minus_dis = tot - xtie - ytie + ntie - 2 * dis
    tau = con_minus_dis / np.sqrt(tot - xtie) / np.sqrt(tot - ytie)
    tau = float(min(1.0, max(-1.0, tau)))
    if xtie == 0 and ytie == 0 and (size <= 33 or min(dis, tot - dis) <= 1):
        return tau, _kendall_p_exact(size, tot - dis)
    m = size * (size - 1.0)
    var = (m * (2 * size + 5) - x1 - y1) / 18 + (2 * xtie * ytie) / m + x0 * y0 / (9 * m * (size - 2))
    z = con_minus_dis / math.sqrt(var)
    return tau, math.erfc(abs(z) / math.sqrt(2.0))  # 2 * (1 - Phi(|z|))


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
    """Ranks 1..n, ties sharing their mean rank (scipy.stats.rankdata, method "average")."""
    order = np.argsort(a, kind="mergesort")
    inv = np.empty(order.size, dtype=np.intp)
    inv[order] = np.arange(order.size, dtype=np.intp)
    s = a[order]
    obs = np.r_[True, s[1:] != s[:-1]]
    dense = obs.cumsum()[inv]
    count = np.r_[np.nonzero(obs)[0], len(obs)]
    return 0.5 * (count[dense] + count[dense - 1] + 1)


def _inversions(y: np.ndarray) -> int:
    """Pairs i < j with y[i] > y[j]: within blocks pairwise, across blocks by binary search into the
    sorted values of the earlier blocks."""
    total = 0
    for start in range(0, y.size, _INVERSION_BLOCK):
        block = y[start : start + _INVERSION_BLOCK]
        if start:
            before = np.sort(y[:start])
            total += int((start - np.searchsorted(before, block, side="right")).sum())
        total += int(np.triu(block[:, np.newaxis] > block[np.newaxis, :], 1).sum())
    return total


def _tie_counts(ranks: np.ndarray) -> tuple[int, int, int]:
    """Tied pairs among dense ranks and the two tie sums of the variance of Kendall's statistic."""
    cnt = np.bincount(ranks).astype(np.int64, copy=False)
    cnt = cnt[cnt > 1]
    return (
        int((cnt * (cnt - 1) // 2).sum()),
        int((cnt * (cnt - 1.0) * (cnt - 2)).sum()),
        int((cnt * (cnt - 1.0) * (2 * cnt + 5)).sum()),
    )


def _kendall_p_exact(n: int, c: int) -> float:
    """Two-sided exact p-value of c concordant pairs among n untied points (Kendall 1970, "Rank
    Correlation Methods"; the recursion scipy.stats uses)."""
    c = int(min(c, (n * (n - 1)) // 2 - c))
    if n <= 2:
        prob = 1.0
    elif c == 0:
        prob = 2.0 / math.factorial(n) if n < 171 else 0.0
    elif c == 1:
        prob = 2.0 / math.factorial(n - 1) if n < 172 else 0.0
    elif 4 * c == n * (n - 1):
        prob = 1.0
    elif n < 171:
        new = np.zeros(c + 1)
        new[0:2] = 1.0
        for j in range(3, n + 1):
            new = np.cumsum(new)
            if j <= c:
                new[j:] -= new[: c + 1 - j]
        prob = 2.0 * np.sum(new) / math.factorial(n)
    else:
        new = np.zeros(c + 1)
        new[0:2] = 1.0
        for j in range(3, n + 1):
            new = np.cumsum(new) / j
            if j <= c:
                new[j:] -= new[: c + 1 - j]
        prob = np.sum(new)
    return float(np.clip(prob, 0.0, 1.0))


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
