"""The detector registry and the few helpers every detector shares.

    @detector("entropy_collapse", page="overview", tables=("steps",))
    def entropy_collapse(view: RunView) -> list[Finding]: ...

One fixed signature: a detector takes a `RunView` and returns a list of findings (empty when healthy); when
the run lacks a setting or column it needs it raises `NotChecked(reason)` (`view.need(column)` does for a
steps column), which the report lists as "not checked". It reads the run's settings from `view.settings`
(tokengrad.doctor.settings: one shape whatever recorded the run). `tables` names what it reads, for the
docs and for `tokengrad doctor --list`.
Detectors are deterministic: the same run gives the same findings.
"""

from __future__ import annotations

import numpy as np

from tokengrad.registry import Registry

DETECTORS: Registry = Registry("detector")


def detector(
    name: str,
    *,
    page: str = "overview",
    tables: tuple[str, ...] = ("steps",),
    per_event=False,
    about: str = "learning",
):
    """Register `fn(view) -> list[Finding]` under `name`; `page` is the dashboard page that shows it;
    `per_event`: each onset step is a new event the live doctor alerts on (a spike), else one per run;
    `about`: "learning", "data" or "machine" (tokengrad.doctor.ranking lists machine findings last)."""
    if about not in ("learning", "data", "machine"):
        raise ValueError(f"about must be learning, data or machine, got {about!r}")
    return DETECTORS.register(name, page=page, tables=tuple(tables), per_event=per_event, about=about)


def window(n: int, share: float = 0.1, least: int = 5) -> int:
    """Size of the start and end windows of an n-step series: a tenth of it, at least `least` steps, at
    most half of it."""
    return max(1, min(n // 2, max(least, int(round(n * share)))))


def window_medians(values) -> tuple[float, float, int]:
    """Medians of the start and end windows of a series (`window`) and the window size."""
    x = np.asarray(values, dtype=float)
    w = window(x.size)
    return float(np.median(x[:w])), float(np.median(x[-w:])), w


def fmt(x: float) -> str:
    """A number for a one-line message: 3 significant digits."""
    return f"{x:.3g}"


def pct(x: float) -> str:
    return f"{100 * x:.0f} %" if abs(x) >= 0.01 or x == 0 else f"{100 * x:.2g} %"
