"""The rollout engine's gap next to the gradient, in DuckDB over the token table: where the sampler and the
trainer disagree (by probability, by position), how much of the update the disagreeing tokens made, and
which sequences a mask removed.

    gap_by_prob(run, bins=10)                     # -> [lo, hi, count, gap_mean, abs_gap_mean, abs_gap_max]
    mismatch_update_share(run, tau=0.1)           # -> per update: the share made by tokens with |d| > tau
    masked_sequences(run)                         # -> which sequences a mask removed, why, reward, advantage

The gap of a token is d = log pi_old - log mu = old_logprob - rollout_logprob (tokengrad.objective.
rollout_correction); tokens without an engine log-prob (rollout_logprob null) have no gap and count in
none of these. Rows as in tokengrad.read.queries: the in-loss rows of every update by default.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tokengrad.read.queries import _base, _binned, bin_edges
from tokengrad.schema import SAMPLE, TOK

GAP = f"({TOK.old_logprob} - {TOK.rollout_logprob})"  # d = log pi_old - log mu
GAP_MEANS = f"avg({GAP}) AS gap_mean, avg(abs({GAP})) AS abs_gap_mean, max(abs({GAP})) AS abs_gap_max"
SCORED = f"isfinite({TOK.rollout_logprob}) AND isfinite({TOK.old_logprob})"  # false for null and NaN


def has_rollout(run) -> bool:
    """Whether any token carries an engine log-prob (rollout_logprob; absent before schema 3, null for
    greedy decoding and for TRL's own generation without vLLM or a rollout_func)."""
    q = f"SELECT count(*) AS n FROM (SELECT 1 FROM tokens WHERE {SCORED} LIMIT 1)"
    return int(run.sql(q)["n"].iloc[0]) > 0


def gap_by_prob(
    run,
    bins: int | Sequence[float] = 10,
    *,
    step_range: tuple[int, int] | None = None,
    update_id: int | None = None,
) -> pd.DataFrame:
    """[lo, hi, count, gap_mean, abs_gap_mean, abs_gap_max] per bin of the trainer's probability `prob`:
    the signed mean gap (< 0: the engine gave the token more mass, as top-p does), the mean and max |d|."""
    w = _base(step_range, True, update_id).add(SCORED)
    return _binned(run, bin_edges(bins), GAP_MEANS, w)


def gap_by_position(
    run,
    bins: int | Sequence[float] = 10,
    *,
    step_range: tuple[int, int] | None = None,
    update_id: int | None = None,
) -> pd.DataFrame:
    """[lo, hi, count, gap_mean, abs_gap_mean, abs_gap_max] per bin of the token position (`bins` equal
    bins from 0 to one past the longest completion, or the given edges; bin i is [e_i, e_{i+1}))."""
    w = _base(step_range, True, update_id).add(SCORED)
    if isinstance(bins, (int, np.integer)):
        top = run.sql(f"SELECT max({TOK.position}) AS m FROM tokens{w.sql()}", w.params)["m"].iloc[0]
        edges = np.linspace(0, (0 if pd.isna(top) else int(top)) + 1, int(bins) + 1)
    else:
        edges = bin_edges(bins)
    # the top edge is one past the longest completion, so the inclusive top never holds a token
    return _binned(run, edges, GAP_MEANS, w, column=TOK.position)


def mismatch_update_share(run, tau: float, *, step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per optimizer update of the attribution steps: [step, update_id, n_tokens, n_scored, n_mismatched,
    token_share, update_share] where the mismatched tokens are the loss tokens with |d| > tau, token_share
    is their share of the scored tokens and update_share the sum of their tokens' update_share: the share
    of the update they made (tokengrad.record.attribution; the shares of all loss tokens plus the bucket
    residual sum to 1, so this can exceed 1 or be negative when other tokens pull the other way).

    Under a token budget (Recorder(budget=K)) only the kept token rows are in the table, so n_tokens,
    token_share and update_share count the kept rows only (the dropped rows' shares are not recorded per
    token). Steps without attribution (update_share null) and updates without a gradient (update_share NaN:
    a share of a zero update is undefined) are left out.
    """
    if not (isinstance(tau, (int, float)) and np.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau must be a finite number >= 0 (nats), got {tau!r}")
    w = _base(step_range, True, None).add(f"isfinite({TOK.update_share})")
    far = f"{SCORED} AND abs({GAP}) > ?"
    q = (
        f"SELECT {TOK.step}, {TOK.update_id}, count(*) AS n_tokens, "
        f"count(*) FILTER (WHERE {SCORED}) AS n_scored, count(*) FILTER (WHERE {far}) AS n_mismatched, "
        f"coalesce(sum({TOK.update_share}) FILTER (WHERE {far}), 0) AS {TOK.update_share} "
        f"FROM tokens{w.sql()} GROUP BY {TOK.step}, {TOK.update_id} ORDER BY {TOK.step}, {TOK.update_id}"
    )
    out = run.sql(q, [float(tau), float(tau)] + w.params)
    out.insert(5, "token_share", out["n_mismatched"] / out["n_scored"].where(out["n_scored"] > 0))
    return out


def masked_sequences(
    run, *, step_range: tuple[int, int] | None = None, limit: int | None = None
) -> pd.DataFrame:
    """The sequences of which a host mask removed at least one token's gradient: [step, sample_id,
    group_id, masked_by, n_masked, n_tokens, reward, advantage, rollout_seq_log_ratio, rollout_gap_mean],
    the largest |rollout_seq_log_ratio| first. n_masked / n_tokens count distinct loss positions (a token
    recorded in several updates counts once); masked_by lists every reason found in the sequence."""
    w = _base(step_range, True, None)
    q = (
        f"WITH t AS (SELECT {TOK.step}, {TOK.sample_id}, any_value({TOK.group_id}) AS {TOK.group_id}, "
        f"count(DISTINCT {TOK.position}) AS n_tokens, "
        f"count(DISTINCT {TOK.position}) FILTER (WHERE {TOK.masked}) AS n_masked, "
        f"string_agg(DISTINCT {TOK.masked_by}, ', ' ORDER BY {TOK.masked_by}) AS {TOK.masked_by} "
        f"FROM tokens{w.sql()} GROUP BY {TOK.step}, {TOK.sample_id} HAVING bool_or({TOK.masked})), "
        f"s AS (SELECT {SAMPLE.step}, {SAMPLE.sample_id}, any_value({SAMPLE.reward}) AS {SAMPLE.reward}, "
        f"any_value({SAMPLE.advantage}) AS {SAMPLE.advantage}, "
        f"any_value({SAMPLE.rollout_seq_log_ratio}) AS {SAMPLE.rollout_seq_log_ratio}, "
        f"any_value({SAMPLE.rollout_gap_mean}) AS {SAMPLE.rollout_gap_mean} "
        f"FROM samples GROUP BY {SAMPLE.step}, {SAMPLE.sample_id}) "
        f"SELECT t.{TOK.step}, t.{TOK.sample_id}, t.{TOK.group_id}, t.{TOK.masked_by}, t.n_masked, "
        f"t.n_tokens, s.{SAMPLE.reward}, s.{SAMPLE.advantage}, s.{SAMPLE.rollout_seq_log_ratio}, "
        f"s.{SAMPLE.rollout_gap_mean} FROM t LEFT JOIN s USING ({TOK.step}, {TOK.sample_id}) "
        f"ORDER BY abs(s.{SAMPLE.rollout_seq_log_ratio}) DESC NULLS LAST, t.{TOK.step}, t.{TOK.sample_id}"
    )
    if limit is not None:
        return run.sql(q + " LIMIT ?", w.params + [int(limit)])
    return run.sql(q, w.params)
