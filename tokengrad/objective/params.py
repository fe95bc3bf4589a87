"""A weighting rule's parameters checked against its defaults: plain Python, no torch, so that a config is
validated before the trainer's modules are imported (tokengrad.train.names knows the built-in rules'
defaults without importing them)."""

from __future__ import annotations

from collections.abc import Mapping

_KINDS = {bool: (bool, "a bool"), int: ((int, float), "a number"), float: ((int, float), "a number")}
_KINDS[str] = (str, "a string")


def check_params(name: str, params: Mapping, defaults: Mapping) -> None:
    """Raise ValueError if ``params`` has keys rule ``name`` does not take (those of ``defaults``), or a
    value of another kind than the parameter's default (a number given as a string or a bool, a string for
    a flag)."""
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise ValueError(f"weighting rule {name!r} has no parameters {unknown}; it takes {sorted(defaults)}")
    for key, value in params.items():
        kind = _KINDS.get(type(defaults[key]))  # a default of None takes any value
        if kind and not (isinstance(value, kind[0]) and (kind[0] is bool or type(value) is not bool)):
            raise ValueError(
                f"weighting rule {name!r}: {key}={value!r} must be {kind[1]}, like {defaults[key]!r}"
            )
