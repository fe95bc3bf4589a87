"""Attribute-style column names of the run format, built from tokengrad.schema.

    from tokengrad.figures.columns import TOK, STEP
    df[TOK.prob]            # "prob"; a name missing from the schema raises AttributeError

The names come from schema.TABLES, so a renamed column fails loudly wherever it is used instead of
silently selecting nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

from ..schema import column_names


def _names(table: str) -> SimpleNamespace:
    return SimpleNamespace(**{c: c for c in column_names(table)})


TOK = _names("tokens")
STEP = _names("steps")
LAYER = _names("layers")
BUCKET = _names("buckets")
SAMPLE = _names("samples")
EVAL = _names("evals")

# Columns of the binned/aggregated frames that tokengrad.queries returns (not stored in the run format).
BIN = SimpleNamespace(lo="lo", hi="hi", count="count")
