"""Helpers shared by the formats that dump whole sequences (prompt and completion tokens in one array, a
loss mask marking the trained tokens): cutting out the completion, numbering samples and groups, and the
checks that name a malformed record."""

from __future__ import annotations

from collections.abc import Mapping


def require(record: Mapping, fields: tuple[str, ...], where: str) -> None:
    """Raise naming every field of `fields` that `record` lacks (a layout this importer does not know)."""
    missing = [f for f in fields if f not in record]
    if missing:
        raise ValueError(
            f"{where} lacks the field(s) {missing} of the layout this importer reads; it has "
            f"{sorted(record)[:20]}. Is it a dump of another format or version?"
        )


def completion_span(loss_mask: list, where: str) -> int:
    """Index of the first trained token: everything before it is the prompt. Later tokens outside the
    loss mask (tool or environment output in a multi-turn completion) stay, with in_loss False."""
    for i, m in enumerate(loss_mask):
        if m:
            return i
    raise ValueError(f"{where} has no token in its loss mask; nothing of it was trained")


def aligned(columns: Mapping[str, list], n: int, where: str) -> None:
    """Every per-token column of a sequence must have one value per token."""
    bad = {k: len(v) for k, v in columns.items() if v is not None and len(v) != n}
    if bad:
        raise ValueError(f"{where}: per-token fields of other lengths than its {n} tokens: {bad}")


def group_ids(n: int, group_size: int | None) -> list[int]:
    """Prompt groups of a step's n completions: consecutive runs of `group_size` (the order GRPO trainers
    lay a group out in); without it each completion is its own group, since the dump does not say."""
    if group_size is None:
        return list(range(n))
    if group_size < 1 or n % group_size:
        raise ValueError(f"a step holds {n} completions, not a multiple of group_size {group_size}")
    return [i // group_size for i in range(n)]


def add_sequence(
    rows: dict[str, list],
    ids: tuple[int, int, int],
    *,
    token_ids: list,
    loss_mask: list,
    per_token: Mapping[str, list | None],
    start: int,
) -> None:
    """Append one completion's token rows (from `start` on) to the step's token columns `rows`; `ids` is
    (sample_id, group_id, pass_id: the micro-batch where the dump says, else 0); update_id is 0."""
    sample_id, group_id, pass_id = ids
    n = len(token_ids) - start
    rows.setdefault("update_id", []).extend([0] * n)
    rows.setdefault("pass_id", []).extend([pass_id] * n)
    rows.setdefault("sample_id", []).extend([sample_id] * n)
    rows.setdefault("group_id", []).extend([group_id] * n)
    rows.setdefault("position", []).extend(range(n))
    rows.setdefault("token_id", []).extend(int(t) for t in token_ids[start:])
    rows.setdefault("in_loss", []).extend(bool(m) for m in loss_mask[start:])
    for name, values in per_token.items():
        rows.setdefault(name, []).extend(values[start:] if values is not None else [None] * n)
