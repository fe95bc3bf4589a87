"""Token text for a finding's evidence: a token holding part of a character that a byte-level tokenizer
split over several tokens reads as the whole character, marked as a part of it
(tokengrad.read.token_text.evidence_text), from its neighbours in the completion.

    evidence_texts(run, 97, [(3, 12), (5, 0)])   # {(3, 12): '中 (token 1 of 3 of a split character)', ...}

The token table keeps its ids and stored pieces; only the text a finding shows is read here.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokengrad.read.char_frequencies import REACH
from tokengrad.read.token_text import evidence_text
from tokengrad.schema import TOK


def evidence_texts(run, step: int, keys: Iterable[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """{(sample_id, position): text} of the step's tokens at `keys`, each read with the REACH tokens
    either side of it in its completion (a UTF-8 character spans at most 4 bytes, so at most 4 tokens).
    A key without a token row is left out."""
    keys = sorted({(int(s), int(p)) for s, p in keys})
    if not keys:
        return {}
    samples = sorted({s for s, _ in keys})
    rows = run.sql(
        f"SELECT {TOK.sample_id} AS s, {TOK.position} AS p, any_value({TOK.token}) AS t FROM tokens "
        f"WHERE {TOK.step} = ? AND {TOK.sample_id} IN ({', '.join('?' * len(samples))}) GROUP BY ALL",
        [int(step), *samples],
    )
    text = {(int(s), int(p)): t for s, p, t in zip(rows["s"], rows["p"], rows["t"])}
    out = {}
    for s, p in keys:
        if (s, p) not in text:
            continue
        window = [text.get((s, q)) for q in range(p - REACH, p + REACH + 1)]
        out[(s, p)] = evidence_text([None if t is None or t != t else str(t) for t in window], REACH)
    return out
