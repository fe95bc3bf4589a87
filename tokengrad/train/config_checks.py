"""The checks and the field helper of the trainer's configuration (tokengrad.train.config): each field is
`setting(default, doc, check)`, where a check returns an error message or None when the value is fine."""

from __future__ import annotations

import os
from dataclasses import field
from typing import Any, Callable, Mapping, Sequence

from tokengrad.train.names import registered

Check = Callable[[Any], "str | None"]  # returns an error message, or None when the value is fine


def setting(default: Any, doc: str, check: Check | None = None) -> Any:
    meta = {"doc": doc, "check": check}
    if isinstance(default, (dict, list)):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


def at_least(lo: float) -> Check:
    return lambda v: None if v >= lo else f"must be >= {lo}"


def positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def dual_clip(v: float) -> str | None:
    return None if v == 0 or v > 1 else "must be 0 (off) or > 1"


def in_unit(v: float) -> str | None:
    return None if 0 < v <= 1 else "must be in (0, 1]"


def one_of(registry: Callable[[], Mapping | Sequence]) -> Check:
    def check(v: str) -> str | None:
        known = sorted(registry())
        return None if v in known else f"unknown name {v!r}; known: {known}"

    return check


def importable(modules: list) -> str | None:
    """Import each plugin module (once; Python caches imports) so that its registrations exist."""
    import importlib

    for name in modules:
        if not isinstance(name, str) or not name:
            return f"plugin entries must be module names, got {name!r}"
        try:
            importlib.import_module(name)
        except ImportError as err:
            return f"cannot import plugin module {name!r}: {err}"
    return None


def known_model(v: str) -> str | None:
    known = registered("model")
    if v in known or os.path.isdir(v):
        return None
    return f"model must be one of {sorted(known)} or a local checkpoint directory, got {v!r}"
