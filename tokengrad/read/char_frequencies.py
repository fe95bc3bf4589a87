"""Word-cloud counts of characters that a byte-level tokenizer split over several tokens.

token_frequencies counts per token id, so the three tokens of '中' (stored '<0xE4>', '<0xB8>', '<0xAD>')
would appear as three byte entries. Here the rows of such part-character tokens are read again with the
3 tokens before and after each occurrence in its completion (DuckDB lag/lead), and merged as the
inspector merges them (tokengrad.read.token_text.merge_tokens): the character counts once, on the token
that completes it, with that token's probability, advantage and gradient deciding whether it is in the
selection; the tokens holding its earlier bytes are continuations and leave the cloud. Bytes that never
form a character stay '<0xNN>'.

    freqs = merge_split_characters(run, freqs, where_sql, params, grad_sql)  # inside token_frequencies
"""

from __future__ import annotations

import pandas as pd

from tokengrad.read.token_text import merge_tokens, readable_token
from tokengrad.schema import BIN, TOK

REACH = 3  # a UTF-8 character has at most 4 bytes: 3 tokens either side reach all of them
_SEQUENCE = (TOK.step, TOK.rank, TOK.update_id, TOK.pass_id, TOK.sample_id)


def is_part_character(token: object) -> bool:
    """True for a token whose text on its own holds bytes of an unfinished character ('<0xE4>')."""
    return isinstance(token, str) and "<0x" in readable_token(token)


def merge_split_characters(
    run, freqs: pd.DataFrame, *, where_sql: str, params: list, grad_sql: str, order_by: str = BIN.count
) -> pd.DataFrame:
    """`freqs` ([token, count, grad_sum]) with its part-character rows replaced by the characters they
    complete in context; `where_sql` (' WHERE ...' or '') and `params` select the rows as for `freqs`.
    The frame comes back ordered as token_frequencies orders it: largest `order_by` first."""
    parts = [t for t in freqs[TOK.token] if is_part_character(t)]
    if not parts:
        return freqs
    around = [f"lag({TOK.token}, {k}) OVER o AS b{k}" for k in range(REACH, 0, -1)]
    around += [f"lead({TOK.token}, {k}) OVER o AS a{k}" for k in range(1, REACH + 1)]
    names = [f"b{k}" for k in range(REACH, 0, -1)] + [TOK.token] + [f"a{k}" for k in range(1, REACH + 1)]
    holes = ", ".join("?" * len(parts))
    cond = f"{TOK.token} IN ({holes})"
    where = f"{where_sql} AND {cond}" if where_sql else f" WHERE {cond}"
    q = (
        f"WITH seq AS (SELECT *, {', '.join(around)} FROM tokens "
        f"WINDOW o AS (PARTITION BY {', '.join(_SEQUENCE)} ORDER BY {TOK.position})) "
        f"SELECT {', '.join(names)}, count(*) AS {BIN.count}, sum({grad_sql}) AS grad_sum "
        f"FROM seq{where} GROUP BY ALL"
    )
    seen = run.sql(q, list(params) + parts)
    shown = [merge_tokens([getattr(r, n) for n in names])[REACH] for r in seen.itertuples(index=False)]
    merged = (
        seen.assign(**{TOK.token: shown})
        .dropna(subset=[TOK.token])  # continuations: their character counts on the token completing it
        .groupby(TOK.token, as_index=False)[[BIN.count, "grad_sum"]]
        .sum()
    )
    whole = freqs[~freqs[TOK.token].isin(parts)]
    both = pd.concat([whole, merged], ignore_index=True) if len(merged) else whole
    return both.sort_values([order_by, TOK.token], ascending=[False, True], ignore_index=True)
