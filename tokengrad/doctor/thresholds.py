"""Thresholds more than one detector module uses. A detector module keeps its own thresholds as module
constants next to their sources; a value several modules share lives here, so no detector module reads
another's (tests/doctor/test_doctor_columns.py holds that)."""

TREND_ALPHA = 0.01  # Mann-Kendall two-sided p-value below which a trend counts (tokengrad default)
