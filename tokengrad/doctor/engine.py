"""Run every registered detector on a run and rank the findings.

    findings = diagnose("runs/demo")                        # all detectors, ranked, critical first
    findings = diagnose(view, only=["gradient_spike"])      # a subset by name (unknown names raise)
    result = examine("runs/demo")                           # the findings and what could not be checked
    result.not_checked                                      # [NotChecked("truncation", "the length ...")]

A detector that fails on a run's data does not hide the others: its error becomes an `info` finding
`detector_error` naming it (so a damaged table shows up instead of silently passing). A detector that
cannot run on a run (a setting or column it needs is missing) raises `NotChecked(reason)`: it is listed in
`not_checked`, so "no finding" never stands for "could not look".
"""

from __future__ import annotations

import importlib
import os
import warnings
from dataclasses import dataclass, replace

from tokengrad.doctor.finding import Finding, NotChecked, rank_findings
from tokengrad.doctor.registry import DETECTORS
from tokengrad.doctor.view import RunView

# modules whose import registers the built-in detectors
DETECTOR_MODULES = (
    "detect_steps",
    "detect_health",
    "detect_samples",
    "detect_outputs",
    "detect_tokens",
    "detect_mismatch",
    "detect_integrity",
    "detect_rewards",
)


def load_detectors() -> None:
    for name in DETECTOR_MODULES:
        importlib.import_module(f"tokengrad.doctor.{name}")


@dataclass(frozen=True)
class Diagnosis:
    findings: list[Finding]  # ranked (rank_findings)
    not_checked: list[NotChecked]  # detectors that could not run on the run, with the reason, by name


def diagnose(
    run: RunView | str | os.PathLike, only: list[str] | None = None, upto: int | None = None
) -> list[Finding]:
    """Findings of the detectors (all, or those named in `only`) on a run, ranked (rank_findings)."""
    return examine(run, only, upto).findings


def examine(
    run: RunView | str | os.PathLike, only: list[str] | None = None, upto: int | None = None
) -> Diagnosis:
    """The ranked findings of the detectors (all, or those named in `only`) and the detectors that could
    not run on this run, each with its reason."""
    load_detectors()
    view = run if isinstance(run, RunView) else RunView.open(run, upto)
    names = list(DETECTORS) if only is None else [n for n in only if DETECTORS[n]]
    out: list[Finding] = []
    skipped: list[NotChecked] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the reader's skipped-file warnings: in view.run
        for name in names:
            entry = DETECTORS[name]
            try:
                found = entry(view)
            except NotChecked as why:
                skipped.append(NotChecked(why.reason, name, view.name))
                continue
            except Exception as err:  # noqa: BLE001 - one detector's failure must not hide the others
                found = [_error(name, err)]
            out += [replace(f, run=view.name, page=_page(f, entry)) for f in found]
    return Diagnosis(rank_findings(out), sorted(skipped, key=lambda n: (n.run, n.detector)))


def _page(finding: Finding, entry) -> str:
    """The detector's page, unless the finding names another itself (a spike with what-if rows at its
    step opens the What if page)."""
    own = finding.page != DEFAULT_PAGE
    return finding.page if own else getattr(entry, "page", finding.page)


DEFAULT_PAGE = Finding.__dataclass_fields__["page"].default


def _error(name: str, err: Exception) -> Finding:
    return Finding(
        id="detector_error",
        severity="info",
        confidence=1.0,
        first_step=None,
        last_step=None,
        message=f"detector {name} could not read this run: {type(err).__name__}: {err}",
        evidence={"detector": name},
    )
