"""tokengrad doctor: ranked findings on a run, with the tokens and samples behind them (read/ only, no torch).

    from tokengrad.doctor import diagnose
    for f in diagnose("runs/demo"):
        print(f.severity, f.id, f.message)

Detectors live in the DETECTORS registry (tokengrad.doctor.registry; one signature: `detector(RunView) ->
list[Finding]`); docs/doctor.md lists each with its statistic, default and source. `tokengrad doctor RUN`
prints them; `Recorder(doctor=Doctor(...))` runs them live (tokengrad.doctor.live).
"""

import importlib

_LAZY = {
    "diagnose": "engine",
    "examine": "engine",
    "NotChecked": "finding",
    "RunSettings": "settings",
    "Finding": "finding",
    "TokenEvidence": "finding",
    "Action": "finding",
    "RunView": "view",
    "DETECTORS": "registry",
    "detector": "registry",
}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
