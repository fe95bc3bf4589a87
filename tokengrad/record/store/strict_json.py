"""The JSON a run's metadata files hold (meta.json, ranks/rankRRR.json): strict JSON (RFC 8259), which every
reader parses. Python's json module would write NaN and Infinity, which strict readers (JavaScript's
JSON.parse, jq, Go, DuckDB's read_json) refuse, and fails on a tuple key with a message that names no key.

    to_json({"lr": float("nan"), "sched": (1, 2)})   # {"lr": None, "sched": [1, 2]}
    to_json({"opt": {(1, 2): 3}})                    # ValueError: meta.json key opt.(1, 2) is a tuple ...

A non-finite number becomes null (the value was not a number anyone can use; a reader sees "no value").
A key that is not a string is refused, naming its path from the top of the file. A scalar with `.item()`
(numpy, torch) is its Python value; any other value is its str(), as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping


def to_json(value, path: str = ""):
    """`value` as plain strict-JSON data (module doc); `path` names where it sits, for the error."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else f"{key}"
            if not isinstance(key, str):
                raise ValueError(
                    f"meta.json key {where} is a {type(key).__name__}, not a string: JSON keys are text; "
                    "rename it (e.g. to a string) before recording"
                )
            out[key] = to_json(item, where)
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int)):  # bool is an int
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return to_json(item(), path)
        except (TypeError, ValueError, RuntimeError):  # an array of several values: its text, as below
            pass
    return str(value)


def dumps(value) -> str:
    """Strict JSON text of `value` (indented, as the run's metadata files are)."""
    return json.dumps(to_json(value), indent=2, allow_nan=False)
