"""The doctor's statistics (tokengrad/doctor/stats.py, numpy only) agree with scipy.stats."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as sps

from tokengrad.doctor.stats import (
    kendall_tau,
    sign_test_greater,
    spearman,
    theil_sen_slope,
    trend,
)

SIZES = (2, 3, 4, 7, 20, 33, 34, 60, 500, 2500)  # exact and asymptotic p; 2500 crosses the blocks


def _pairs(n: int, seed: int, ties: bool):
    rng = np.random.default_rng(seed)
    if ties:
        return rng.integers(0, max(2, n // 3), n).astype(float), rng.integers(0, 5, n).astype(float)
    x = rng.permutation(n).astype(float)
    return x, 0.3 * x + rng.normal(size=n) * n / 4


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("ties", [False, True])
def test_kendall_tau_matches_scipy(n, ties):
    for seed in range(3):
        x, y = _pairs(n, seed, ties)
        want = sps.kendalltau(x, y)
        tau, p = kendall_tau(x, y)
        np.testing.assert_allclose([tau, p], [want.statistic, want.pvalue], rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize(
    "x, y",
    [
        ([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7]),  # a perfect rise: the exact distribution's tail
        ([1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]),
        ([1, 2, 3, 4], [1, 2, 4, 3]),
        (list(range(40)), list(range(39)) + [-1]),  # one pair out of order past 33: exact
        (list(range(200)), list(range(1, 200)) + [0]),
        ([1, 1, 1], [1, 2, 3]),  # a constant side: NaN
        ([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]),
    ],
)
def test_kendall_tau_edge_cases(x, y):
    want = sps.kendalltau(x, y)
    np.testing.assert_allclose(kendall_tau(x, y), [want.statistic, want.pvalue], rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("n", [2, 3, 10, 101])
def test_theil_sen_matches_scipy(n):
    rng = np.random.default_rng(n)
    x = np.sort(rng.integers(0, n, n)).astype(float)  # repeated x: only pairs with distinct x count
    y = 2.0 * x + rng.normal(size=n)
    if np.ptp(x) == 0:
        x[-1] += 1
    assert theil_sen_slope(y, x) == pytest.approx(sps.theilslopes(y, x).slope, rel=1e-12)


@pytest.mark.parametrize("n", [3, 8, 50, 300])
def test_spearman_matches_scipy(n):
    rng = np.random.default_rng(n)
    a = rng.integers(0, 6, n).astype(float)
    b = a + rng.normal(size=n)
    assert spearman(a, b) == pytest.approx(sps.spearmanr(a, b).statistic, rel=1e-12)


@pytest.mark.parametrize("n", [1, 5, 10, 37, 300])
def test_sign_test_matches_scipy(n):
    for k in range(n + 1):
        want = sps.binomtest(k, n, 0.5, alternative="greater").pvalue
        assert sign_test_greater(k, n) == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_trend_matches_scipy_on_steps():
    rng = np.random.default_rng(0)
    steps = np.arange(0, 400, 2)
    y = np.r_[rng.normal(size=150), rng.normal(size=50) + 0.5]
    y[[3, 70]] = np.nan
    tr = trend(y, steps)
    keep = np.isfinite(y)
    want = sps.kendalltau(steps[keep], y[keep])
    assert (tr.tau, tr.p_value, tr.n) == (
        pytest.approx(want.statistic, rel=1e-12),
        pytest.approx(want.pvalue, rel=1e-9),
        keep.sum(),
    )
    assert tr.slope == pytest.approx(sps.theilslopes(y[keep], steps[keep]).slope, rel=1e-12)


@pytest.mark.subprocess
def test_doctor_does_not_import_scipy_stats():
    """scipy.stats costs over a second to import; the dashboard's first page runs every detector."""
    code = "import sys, tokengrad.doctor.engine as e; e.load_detectors(); print('scipy.stats' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
