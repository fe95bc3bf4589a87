"""Aggregations over a run's token table, computed in DuckDB so the table is never loaded into pandas.

    run = load_run("runs/tr_grpo")
    token_frequencies(run, prob_lo=0.75, prob_hi=1.0, adv_sign=1)      # -> [token, count]
    prob_histogram(run, bins=20)                                       # -> [lo, hi, count]
    grad_norm_by_prob(run, bins=20)                                    # -> [lo, hi, count, prob, ...means]
    top_tokens(run, step=40, k=20)                                     # spike forensics

Which token rows count: a token can be recorded once per backward pass of its step (several PPO passes,
Lopti phases). The loss-token aggregations (word clouds, histogram, gradient norm by probability) read
the in-loss rows of every update by default: with Lopti each token is in the loss of exactly one phase,
so it counts once (low-probability tokens in update 0, the others in update 1); with mu > 1 passes each
token counts mu times, which leaves shares and means as they are. Tool output and other masked tokens
are not the policy's choices and never count. The per-step forensics (top_tokens, top_samples,
sample_tokens) read the step's combined update by default, or one update (`update_id`): a token's share
of either is tokengrad.read.token_shares', the one the doctor's culprits read.

A run is anything with `sql(query, params) -> DataFrame` over views named after the tables
(tokengrad.read.runs.Run).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from tokengrad.read import token_shares
from tokengrad.read.char_frequencies import merge_split_characters
from tokengrad.read.token_sql import ADV_SIGN_SQL, GRAD, Where, bin_edges, binned, token_where
from tokengrad.schema import BIN, SAMPLE, TOK, column_names

# Per-token columns whose per-bin mean grad_norm_by_prob reports.
BINNED_MEANS = (TOK.prob, TOK.logit_grad_unit, TOK.logit_grad_norm, TOK.head_grad_norm, TOK.entropy)
ABS_COEF = "abs_coef"
# Token columns the forensics tables show next to the ranked value.
FORENSIC_COLUMNS = (
    TOK.sample_id,
    TOK.group_id,
    TOK.position,
    TOK.token,
    TOK.prob,
    TOK.entropy,
    TOK.advantage,
    TOK.weight,
    TOK.coef,
    TOK.clipped,
)


def _prob_range(w: Where, lo: float, hi: float) -> Where:
    """lo <= prob < hi, with hi inclusive at 1 (as the schema's bucket edges)."""
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"need 0 <= prob_lo < prob_hi <= 1, got prob_lo={lo}, prob_hi={hi}")
    return w.add(f"{TOK.prob} >= ?", float(lo)).add(f"{TOK.prob} {'<=' if hi >= 1.0 else '<'} ?", float(hi))


def _token_column(name: str) -> str:
    if name not in column_names("tokens"):
        raise ValueError(f"{name!r} is not a tokens column; columns: {sorted(column_names('tokens'))}")
    return name


def _frequency_where(prob_lo, prob_hi, *, step_range, adv_sign, loss_only, update_id) -> Where:
    if adv_sign is not None and adv_sign not in ADV_SIGN_SQL:
        raise ValueError(f"adv_sign must be one of {sorted(ADV_SIGN_SQL)} or None, got {adv_sign!r}")
    w = _prob_range(token_where(step_range, loss_only, update_id), prob_lo, prob_hi)
    if adv_sign is not None:
        w.add(ADV_SIGN_SQL[adv_sign])
    return w


def token_frequencies(
    run,
    prob_lo: float = 0.0,
    prob_hi: float = 1.0,
    *,
    step_range: tuple[int, int] | None = None,
    adv_sign: int | None = None,
    limit: int = 200,
    loss_only: bool = True,
    update_id: int | None = None,
    order_by: str = BIN.count,
) -> pd.DataFrame:
    """[token, count, grad_sum] of the tokens with prob in [prob_lo, prob_hi), largest `order_by` first
    (count, or grad_sum: the summed per-token gradient norm, logit_grad_norm).

    adv_sign 1 / -1 / 0 keeps tokens with positive / negative / zero advantage (None: all). Tokens with
    no decoded text (recorded without a tokenizer) are named '#<token_id>'. Tokens holding part of a
    character are counted as that character, on the token that completes it
    (tokengrad.read.char_frequencies).
    """
    if int(limit) < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if order_by not in (BIN.count, "grad_sum"):
        raise ValueError(f"order_by must be 'count' or 'grad_sum', got {order_by!r}")
    w = _frequency_where(
        prob_lo, prob_hi, step_range=step_range, adv_sign=adv_sign, loss_only=loss_only, update_id=update_id
    )
    # count per integer token_id first (cheap hash keys), name only the surviving groups
    name = f"coalesce(nullif(any_value({TOK.token}), ''), '#' || CAST({TOK.token_id} AS VARCHAR))"
    q = (
        f"SELECT {name} AS {TOK.token}, count(*) AS {BIN.count}, sum({GRAD}) AS grad_sum "
        f"FROM tokens{w.sql()} "
        f"GROUP BY {TOK.token_id} ORDER BY {order_by} DESC, {TOK.token} LIMIT ?"
    )
    freqs = run.sql(q, w.params + [int(limit)])
    # a character split over tokens ('<0xE4>', '<0xB8>', '<0xAD>') counts once, as itself
    return merge_split_characters(
        run, freqs, where_sql=w.sql(), params=w.params, grad_sql=GRAD, order_by=order_by
    )


def token_totals(
    run,
    prob_lo: float = 0.0,
    prob_hi: float = 1.0,
    *,
    step_range: tuple[int, int] | None = None,
    adv_sign: int | None = None,
    loss_only: bool = True,
    update_id: int | None = None,
) -> dict:
    """{count, distinct, grad_sum, all_count, all_grad_sum} of a token_frequencies selection, and of the
    same selection over every probability (the word clouds' totals: n tokens, share of the gradient)."""
    w = _frequency_where(
        prob_lo, prob_hi, step_range=step_range, adv_sign=adv_sign, loss_only=loss_only, update_id=update_id
    )
    every = _frequency_where(
        0.0, 1.0, step_range=step_range, adv_sign=adv_sign, loss_only=loss_only, update_id=update_id
    )
    sel = run.sql(
        f"SELECT count(*) AS n, count(DISTINCT {TOK.token_id}) AS d, sum({GRAD}) AS g FROM tokens{w.sql()}",
        w.params,
    ).iloc[0]
    tot = run.sql(f"SELECT count(*) AS n, sum({GRAD}) AS g FROM tokens{every.sql()}", every.params).iloc[0]
    num = lambda v: float(v) if pd.notna(v) else 0.0  # noqa: E731 - SUM over no rows is NULL
    return {
        "count": int(sel["n"]),
        "distinct": int(sel["d"]),
        "grad_sum": num(sel["g"]),
        "all_count": int(tot["n"]),
        "all_grad_sum": num(tot["g"]),
    }


def prob_histogram(
    run,
    bins: int | Sequence[float] = 20,
    *,
    step_range: tuple[int, int] | None = None,
    loss_only: bool = True,
    update_id: int | None = None,
) -> pd.DataFrame:
    """[lo, hi, count]: how many tokens fall in each probability bin."""
    return binned(run, bin_edges(bins), "", token_where(step_range, loss_only, update_id))


def grad_norm_by_prob(
    run,
    bins: int | Sequence[float] = 20,
    *,
    step_range: tuple[int, int] | None = None,
    loss_only: bool = True,
    update_id: int | None = None,
) -> pd.DataFrame:
    """[lo, hi, count, prob, logit_grad_unit, logit_grad_norm, head_grad_norm, entropy, abs_coef]: per-bin
    means of the per-token values (NaN where a bin is empty or the column was not recorded).

    The mean of logit_grad_unit against the mean prob reproduces the (1 - p) law of AR-Lopti
    (arXiv 2505.12929, Prop. 4.2); see figures.buckets.make_grad_vs_prob_figure.
    """
    means = ", ".join([f"avg({c}) AS {c}" for c in BINNED_MEANS] + [f"avg(abs({TOK.coef})) AS {ABS_COEF}"])
    return binned(run, bin_edges(bins), means, token_where(step_range, loss_only, update_id))


CONTEXT_MARKS = ("⟦", "⟧")  # around the ranked token in top_tokens' context column


def _context(step: int, update_id: int | None, n: int) -> tuple[str, list]:
    """[sample_id, position, context]: each token of the step with the n tokens before and after it."""
    picked, params = token_shares.picked_rows_sql(step, update_id)
    frame = f"OVER (PARTITION BY {TOK.sample_id} ORDER BY {TOK.position} ROWS BETWEEN"
    open_, close = CONTEXT_MARKS
    around = (
        f"coalesce(string_agg({TOK.token}, '') {frame} {n} PRECEDING AND 1 PRECEDING), '') || '{open_}' || "
        f"coalesce({TOK.token}, '') || '{close}' || "
        f"coalesce(string_agg({TOK.token}, '') {frame} 1 FOLLOWING AND {n} FOLLOWING), '')"
        if n
        else f"'{open_}' || coalesce({TOK.token}, '') || '{close}'"
    )
    return f"SELECT {TOK.sample_id}, {TOK.position}, {around} AS context FROM ({picked})", params


def top_tokens(
    run,
    step: int,
    k: int = 20,
    *,
    value: str = TOK.logit_grad_norm,
    update_id: int | None = None,
    context: int = 5,
) -> pd.DataFrame:
    """The k loss tokens of a step with the largest share (tokengrad.read.token_shares: the doctor's
    culprits read the same), of the step's combined update (update_id None) or of one update.

    share: with value = logit_grad_norm, how much of the summed per-token logit-gradient norm one token
    carries (a spike made by a few tokens shows shares near 1); with update_share, its exact share of the
    update. updates: the updates whose loss held the token. context: the `context` tokens before and after
    it in its completion, the token itself in ⟦ ⟧.
    """
    v = _token_column(value)
    shares, params = token_shares.shares_sql(run, step, v, update_id)
    picked, pp = token_shares.picked_rows_sql(step, update_id)
    around, cp = _context(step, update_id, max(int(context), 0))
    cols = ", ".join(f"p.{c}" for c in FORENSIC_COLUMNS if c != v)
    keys = f"USING ({TOK.sample_id}, {TOK.position})"
    q = (
        f"SELECT {cols}, s.{v}, s.share, s.updates, c.context FROM ({shares}) s JOIN ({picked}) p {keys} "
        f"JOIN ({around}) c {keys} "
        f"ORDER BY abs(s.share) DESC NULLS LAST, s.{v} DESC, p.{TOK.sample_id}, p.{TOK.position} LIMIT ?"
    )
    return run.sql(q, params + pp + cp + [int(k)])


def top_samples(
    run,
    step: int,
    k: int = 10,
    *,
    value: str = TOK.logit_grad_norm,
    update_id: int | None = None,
) -> pd.DataFrame:
    """The k completions of a step with the largest share, the sum of their loss tokens' shares
    (tokengrad.read.token_shares), with their token count, mean prob and (from the samples table) reward
    and completion text. A completion without a loss token has share NaN and comes last."""
    v = _token_column(value)
    shares, params = token_shares.shares_sql(run, step, v, update_id)
    picked, pp = token_shares.picked_rows_sql(step, update_id)
    q = (
        f"WITH s AS (SELECT {TOK.sample_id}, sum({v}) AS {v}_sum, sum(share) AS share FROM ({shares}) "
        f"GROUP BY {TOK.sample_id}), t AS (SELECT {TOK.sample_id}, any_value({TOK.group_id}) AS "
        f"{TOK.group_id}, count(*) AS n_tokens, avg({TOK.prob}) AS prob_mean, avg({TOK.advantage}) AS "
        f"{TOK.advantage} FROM ({picked}) GROUP BY {TOK.sample_id}) "
        f"SELECT t.*, s.{v}_sum, s.share, r.{SAMPLE.reward}, r.{SAMPLE.completion} FROM t "
        f"LEFT JOIN s USING ({TOK.sample_id}) LEFT JOIN "
        f"(SELECT {SAMPLE.sample_id}, any_value({SAMPLE.reward}) AS {SAMPLE.reward}, "
        f"any_value({SAMPLE.completion}) AS {SAMPLE.completion} FROM samples WHERE {SAMPLE.step} = ? "
        f"GROUP BY {SAMPLE.sample_id}) r USING ({TOK.sample_id}) "
        f"ORDER BY s.share DESC NULLS LAST, t.{TOK.sample_id} LIMIT ?"
    )
    return run.sql(q, params + pp + [int(step), int(k)])


def sample_tokens(run, step: int, sample_id: int, *, update_id: int | None = None) -> pd.DataFrame:
    """Every recorded column of one completion's tokens, ordered by position: of one update, or (None) each
    token's row in the loss of the update that trained it (token_shares.picked_rows_sql)."""
    picked, params = token_shares.picked_rows_sql(step, update_id)
    q = f"SELECT * FROM ({picked}) WHERE {TOK.sample_id} = ? ORDER BY {TOK.position}"
    return run.sql(q, params + [int(sample_id)])


def token_steps(run) -> list[int]:
    """Steps that have token rows, ascending."""
    df = run.sql(f"SELECT DISTINCT {TOK.step} FROM tokens ORDER BY {TOK.step}")
    return [int(s) for s in df[TOK.step]]
