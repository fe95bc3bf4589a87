"""Run every registered detector on a run and rank the findings.

    findings = diagnose("runs/demo")                        # all detectors, ranked, critical first
    findings = diagnose(view, only=["gradient_spike"])      # a subset by name (unknown names raise)
    result = examine("runs/demo")                           # the findings and what could not be checked
    result.not_checked                                      # [NotChecked("truncation", "the length ...")]

A detector that fails on a run's data does not hide the others: its error becomes an `info` finding
`detector_error` naming it (so a damaged table shows up instead of silently passing). A detector that
cannot run on a run (a setting or column it needs is missing) raises `NotChecked(reason)`: it is listed in
`not_checked`, so "no finding" never stands for "could not look". A detector that found nothing on a table
that lost files (unreadable, or a rank's folder gone: tokengrad.doctor.detect_files) is listed there too,
with the loss as its reason: it looked at part of the run only.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
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
    "detect_ranks",
    "detect_rewards",
    "detect_upload",
    "detect_files",
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
    with _quiet_reader():
        for name in names:
            entry = DETECTORS[name]
            try:
                found = entry(view)
            except NotChecked as why:
                found, reason = [], why.reason
            except Exception as err:  # noqa: BLE001 - one detector's failure must not hide the others
                found, reason = [_error(name, err)], None
            else:
                reason = None
            lost = None if found else _lost(view, entry)
            if lost or reason:
                skipped.append(NotChecked(lost or reason, name, view.name))
            out += [replace(f, run=view.name, page=_page(f, entry)) for f in found]
    return Diagnosis(rank_findings(out), sorted(skipped, key=lambda n: (n.run, n.detector)))


@contextlib.contextmanager
def _quiet_reader():
    """The reader's skipped-file warnings left out (they are in view.run and the files finding). Only on
    the main thread: catch_warnings swaps process-wide state, so a live doctor's thread entering it could
    restore stale filters over a caller's own (pytest.warns, a user's catch_warnings) on its way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def _lost(view: RunView, entry) -> str | None:
    """Why a detector that found nothing did not look at the whole run: a table it reads lost files
    (tokengrad.doctor.detect_files reports them), else None."""
    tables = tuple(getattr(entry, "tables", ()))
    if not tables:
        return None
    try:
        lost = view.losses.about(tables)
    except Exception:  # noqa: BLE001 - the listing itself failed: unreadable_files reports that
        return None
    return f"{lost} (a files finding names them)" if lost else None


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
