"""The gradient-spike rule, shared by the doctor's `gradient_spike` detector (over a run read from disk) and
the recorder's on-spike attribution (over the norms seen so far, on the training thread): numpy only, so
tokengrad.record may import it without loading the doctor's pandas/DuckDB side.

    robust_z(x)                      # 0.6745 (x - median) / MAD (Iglewicz & Hoaglin 1993), NaN where no scale
    is_spike(z)                      # z > SPIKE_Z
"""

from __future__ import annotations

import numpy as np

# Iglewicz & Hoaglin (1993), "How to Detect and Handle Outliers": modified z-score M = 0.6745 (x - med) / MAD;
# 0.6745 = 1 / 1.4826 makes the MAD estimate the standard deviation of normal data. A point with M > 3.5 is a
# potential outlier (their recommended cut; the dashboard's DEFAULT_SPIKE_K).
MAD_Z = 0.6745
SPIKE_Z = 3.5
SPIKE_MIN_STEPS = 10  # live steps needed for a median/MAD reference


def robust_z(values, reference=None) -> np.ndarray:
    """Modified z-scores of `values` against the median and MAD of `reference` (default: the values
    themselves), over the finite reference values. All NaN when there is no robust scale (MAD 0: more
    than half of the reference values are equal) or no reference value."""
    x = np.asarray(values, dtype=float)
    ref = x if reference is None else np.asarray(reference, dtype=float)
    ref = ref[np.isfinite(ref)]
    if ref.size == 0:
        return np.full(x.shape, np.nan)
    med = float(np.median(ref))
    mad = float(np.median(np.abs(ref - med)))
    if mad <= 0:
        return np.full(x.shape, np.nan)
    return MAD_Z * (x - med) / mad


def is_spike(z: float) -> bool:
    """The rule itself: a modified z-score above SPIKE_Z (NaN, no robust scale, is no spike)."""
    return bool(np.isfinite(z) and z > SPIKE_Z)
