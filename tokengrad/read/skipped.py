"""A run's reader warnings for a terminal: the files it skipped as a count and the first few, every other
warning as it is. A run with thousands of damaged or empty files then takes a few lines, not one per file.

    skipped_lines(run.warnings)
    # ["skipped 5000 files the reader could not use (tokens 5000); the first 3:",
    #  "  skipped corrupt file .../s00000100-00000100.parquet: ArrowInvalid: Parquet file size is 0 bytes",
    #  ..., "  ... and 4997 more (load_run(RUN).warnings lists every one)"]
"""

from __future__ import annotations

import re
from collections import Counter

SHOWN = 3  # skipped files named one by one
# tokengrad.read.runs: "skipped [corrupt |unreadable status ]file PATH: why"
_SKIPPED = re.compile(r"^skipped (?:[a-z]+ )*file (?P<path>.+?): ")
_TABLE = re.compile(r"/(?P<table>[A-Za-z_]+)/rank\d+/[^/]+$")


def skipped_lines(warnings: list[str], shown: int = SHOWN) -> list[str]:
    """The lines that stand for `warnings` (Run.warnings): other warnings first, each once; then one line
    counting the skipped files (each file once, by table), the first `shown` of them and how many more."""
    other: list[str] = []
    files: dict[str, str] = {}  # path -> its first warning
    for w in dict.fromkeys(warnings):
        m = _SKIPPED.match(w)
        if m is None:
            other.append(w)
        else:
            files.setdefault(m.group("path"), w)
    if not files:
        return other
    by_table = Counter(_table(p) for p in files)
    tables = ", ".join(f"{t} {n}" for t, n in sorted(by_table.items()))
    head = f"skipped {len(files)} file{'s' if len(files) > 1 else ''} the reader could not use ({tables})"
    first = list(files.values())[:shown]
    lines = [head + (f"; the first {len(first)}:" if len(files) > len(first) else ":")]
    lines += [f"  {w}" for w in first]
    if len(files) > len(first):
        lines.append(f"  ... and {len(files) - len(first)} more (load_run(RUN).warnings lists every one)")
    return other + lines


def _table(path: str) -> str:
    m = _TABLE.search(path)
    return m.group("table") if m else "other"
