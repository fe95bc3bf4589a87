"""The order of findings in the report, the CLI and the landing page: what the run learned (and whether its
recorded data can be trusted) before what the machine did.

    rank_findings(findings)          # tokengrad.doctor.finding re-exports it
    found.sort(key=rank_key)         # the landing page sorts Finding.as_dict() dicts the same way

Each detector says what its findings are about (`detector(..., about=...)`, tokengrad.doctor.registry):
"learning" (the default), "data" (the per-token record itself is wrong) or "machine" (the hardware or its
load, e.g. `throughput_decay`, whose step times follow whatever else runs on the machine). Machine findings
come after every other finding; within each part, critical first, then higher confidence, earlier onset,
id and run (deterministic).
"""

from __future__ import annotations

from collections.abc import Mapping

from tokengrad.doctor.registry import DETECTORS

ABOUT = ("learning", "data", "machine")
_LAST = frozenset({"machine"})
_LEVEL = {"info": 0, "warning": 1, "critical": 2}


def about(finding_id: str) -> str:
    """What a finding is about: its detector's `about`; "learning" for ids no detector is named after
    (detector_error)."""
    return getattr(DETECTORS.get(finding_id), "about", "learning")


def rank_key(f) -> tuple:
    """The sort key of a Finding or of its as_dict() form."""
    get = f.get if isinstance(f, Mapping) else lambda k: getattr(f, k)
    first = get("first_step")
    return (
        about(get("id")) in _LAST,
        -_LEVEL[get("severity")],
        -float(get("confidence")),
        first if first is not None else -1,
        get("id"),
        get("run"),
    )


def rank_findings(findings: list) -> list:
    return sorted(findings, key=rank_key)
