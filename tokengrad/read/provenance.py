"""Where a run came from, as meta.json says: a run `tokengrad import` made from another framework's dump
names its source and the columns the source did not record (tokengrad.importers.sink). No torch.

    not_recorded(run.meta, "tokens")     # {"coef", "old_logprob", ...}; empty for a recorded run
    source_note(run.meta)                # "imported from prime_rl (path)", or None
"""

from __future__ import annotations

NOT_RECORDED = "not recorded by the source"


def imported(meta: dict) -> dict | None:
    value = meta.get("imported")
    return value if isinstance(value, dict) else None


def not_recorded(meta: dict, table: str) -> set[str]:
    """Columns of `table` the run's source did not record (every column, for a table it has no rows of)."""
    info = imported(meta)
    if info is None:
        return set()
    cols = (info.get("not_recorded") or {}).get(table)
    if isinstance(cols, list):
        return {c for c in cols if isinstance(c, str)}
    if table in (info.get("tables_not_recorded") or []):
        from tokengrad import schema

        return set(schema.column_names(table)) - {"step", "rank"}
    return set()


def source_note(meta: dict) -> str | None:
    """'imported from FORMAT (SOURCE)' for an imported run, else None."""
    info = imported(meta)
    if info is None:
        return None
    return f"imported from {info.get('format')} ({info.get('source')})"
