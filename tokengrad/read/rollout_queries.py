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

from tokengrad.read.token_sql import bin_edges, binned, token_where
from tokengrad.schema import SAMPLE, TOK

GAP = f"({TOK.old_logprob} - {TOK.rollout_logprob})"  # d = log pi_old - log mu
GAP_MEANS = f"avg({GAP}) AS gap_mean, avg(abs({GAP})) AS abs_gap_mean, max(abs({GAP})) AS abs_gap_max"
SCORED = f"isfinite({TOK.rollout_logprob}) AND isfinite({TOK.old_logprob})"  # false for null and NaN

# The off-policy gap of a token row, log pi_theta - log mu = staleness + mismatch (the PPO ratio's
# factorisation log(pi_theta / mu) = log(pi_theta / pi_old) + log(pi_old / mu); TRL PR #7120 names the two
# parts policy drift and training-inference mismatch, which an async trainer's single ratio folds together):
# - mismatch: log pi_old - log mu, the trainer against the engine at the version that sampled (the gap d;
#   pure engine mismatch where old_logprob was scored at policy_version: the built-in trainer, TRL's
#   GRPOTrainer, verl's synchronous trainer; verl's async modes re-score pi_old at a later version).
# - staleness: log pi_theta - log pi_old, the trainer against itself across versions: the row's `logprob`
#   at trainer_version against pi_old at policy_version. Defined only where the host recorded both
#   versions (it then promises old_logprob is at policy_version); exactly 0 at lag 0 in the built-in trainer.
MISMATCH = GAP
STALENESS = f"({TOK.logprob} - {TOK.old_logprob})"
LAG = f"({TOK.trainer_version} - {TOK.policy_version})"  # staleness in versions
VERSIONED = f"{LAG} IS NOT NULL AND isfinite({TOK.logprob}) AND isfinite({TOK.old_logprob})"
# The healthy band of the mismatch, mean |d| per token in nats: the doctor's rollout_mismatch thresholds
# (tokengrad.doctor.detect_mismatch MISMATCH_WARNING / _CRITICAL: about 1e-7 for an fp32 sampler, 1e-3 to
# 3e-2 for bf16 engines, rarely above 0.1; Yao et al. 2025, verl PR #7749) and NeMo-RL's
# token_mult_prob_error, the mean of exp(|d|) over tokens: about 1.0, above 1.05 "a potential framework
# issue" (NeMo-RL PR #1767).
MISMATCH_WARNING, MISMATCH_CRITICAL, MULT_PROB_ERROR_SUSPECT = 0.01, 0.1, 1.05


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
    w = token_where(step_range, True, update_id).add(SCORED)
    return binned(run, bin_edges(bins), GAP_MEANS, w)


def gap_by_position(
    run,
    bins: int | Sequence[float] = 10,
    *,
    step_range: tuple[int, int] | None = None,
    update_id: int | None = None,
) -> pd.DataFrame:
    """[lo, hi, count, gap_mean, abs_gap_mean, abs_gap_max] per bin of the token position (`bins` equal
    bins from 0 to one past the longest completion, or the given edges; bin i is [e_i, e_{i+1}))."""
    w = token_where(step_range, True, update_id).add(SCORED)
    if isinstance(bins, (int, np.integer)):
        top = run.sql(f"SELECT max({TOK.position}) AS m FROM tokens{w.sql()}", w.params)["m"].iloc[0]
        edges = np.linspace(0, (0 if pd.isna(top) else int(top)) + 1, int(bins) + 1)
    else:
        edges = bin_edges(bins)
    # the top edge is one past the longest completion, so the inclusive top never holds a token
    return binned(run, edges, GAP_MEANS, w, column=TOK.position)


def mismatch_update_share(run, tau: float, *, step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per optimizer update of the attribution steps: [step, update_id, n_tokens, n_scored, n_mismatched,
    token_share, update_share] where the mismatched tokens are the loss tokens with |d| > tau, token_share
    is their share of the scored tokens and update_share the sum of their tokens' update_share: the share
    of the update they made (record/attribution/shares.py; the shares of all loss tokens plus the bucket
    residual sum to 1, so this can exceed 1 or be negative when other tokens pull the other way).

    Under a token budget (Recorder(budget=K)) only the kept token rows are in the table, so n_tokens,
    token_share and update_share count the kept rows only (the dropped rows' shares are not recorded per
    token). Steps without attribution (update_share null) and updates without a gradient (update_share NaN:
    a share of a zero update is undefined) are left out.
    """
    if not (isinstance(tau, (int, float)) and np.isfinite(tau) and tau >= 0):
        raise ValueError(f"tau must be a finite number >= 0 (nats), got {tau!r}")
    w = token_where(step_range, True, None).add(f"isfinite({TOK.update_share})")
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
    w = token_where(step_range, True, None)
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


def has_staleness(run) -> bool:
    """Whether any loss token was scored by a later version than the one that sampled it."""
    q = f"SELECT count(*) AS n FROM (SELECT 1 FROM tokens WHERE {TOK.in_loss} AND {LAG} > 0 LIMIT 1)"
    return int(run.sql(q)["n"].iloc[0]) > 0


def off_policy_split(run, *, step_range: tuple[int, int] | None = None) -> pd.DataFrame:
    """Per step, the two parts of the off-policy gap over the in-loss rows (MISMATCH, STALENESS):
    [step, n_scored, mismatch_abs_mean, mismatch_abs_max, n_stale, staleness_abs_mean, staleness_abs_max,
    lag_mean, lag_max]. Mismatch over the rows the engine scored; staleness over the rows with both
    versions whose lag is > 0 (n_stale; a step with none has null staleness); lag in versions."""
    w = token_where(step_range, True, None)
    stale = f"{VERSIONED} AND {LAG} > 0"
    q = (
        f"SELECT {TOK.step}, count(*) FILTER (WHERE {SCORED}) AS n_scored, "
        f"avg(abs({MISMATCH})) FILTER (WHERE {SCORED}) AS mismatch_abs_mean, "
        f"max(abs({MISMATCH})) FILTER (WHERE {SCORED}) AS mismatch_abs_max, "
        f"count(*) FILTER (WHERE {stale}) AS n_stale, "
        f"avg(abs({STALENESS})) FILTER (WHERE {stale}) AS staleness_abs_mean, "
        f"max(abs({STALENESS})) FILTER (WHERE {stale}) AS staleness_abs_max, "
        f"avg({LAG}) FILTER (WHERE {VERSIONED}) AS lag_mean, "
        f"max({LAG}) FILTER (WHERE {VERSIONED}) AS lag_max "
        f"FROM tokens{w.sql()} GROUP BY {TOK.step} ORDER BY {TOK.step}"
    )
    return run.sql(q, w.params)


def gap_summary(run, *, step_range: tuple[int, int] | None = None) -> dict[str, float]:
    """The run's mismatch and staleness in one place: n_scored, mismatch_abs_mean, mismatch_abs_max and
    token_mult_prob_error (NeMo-RL's mean exp(|d|)) over distinct scored loss tokens (a token recorded in
    several updates counts once: its mismatch is the same in each), and n_stale, staleness_abs_mean,
    staleness_abs_max, lag_max over the stale rows. NaN where there is nothing to measure."""
    w = token_where(step_range, True, None).add(SCORED)
    once = (
        f"QUALIFY row_number() OVER (PARTITION BY {TOK.step}, {TOK.rank}, {TOK.sample_id}, {TOK.position} "
        f"ORDER BY {TOK.update_id}, {TOK.pass_id}) = 1"
    )
    q = (
        f"SELECT count(*) AS n_scored, avg(abs(d)) AS mismatch_abs_mean, max(abs(d)) AS mismatch_abs_max, "
        f"avg(exp(abs(d))) AS token_mult_prob_error FROM "
        f"(SELECT {MISMATCH} AS d FROM tokens{w.sql()} {once})"
    )
    out = run.sql(q, w.params).iloc[0].to_dict()
    w = token_where(step_range, True, None).add(f"{VERSIONED} AND {LAG} > 0")
    q = (
        f"SELECT count(*) AS n_stale, avg(abs({STALENESS})) AS staleness_abs_mean, "
        f"max(abs({STALENESS})) AS staleness_abs_max, max({LAG}) AS lag_max FROM tokens{w.sql()}"
    )
    out.update(run.sql(q, w.params).iloc[0].to_dict())
    return {k: (float(v) if pd.notna(v) else np.nan) for k, v in out.items()}


def mismatch_level(mean_abs: float) -> str:
    """'healthy' below MISMATCH_WARNING nats per token, 'warning' below MISMATCH_CRITICAL, else
    'critical'; 'unknown' for NaN."""
    if not np.isfinite(mean_abs):
        return "unknown"
    return (
        "healthy"
        if mean_abs < MISMATCH_WARNING
        else "warning"
        if mean_abs < MISMATCH_CRITICAL
        else "critical"
    )


def confident_disagreements(
    run,
    *,
    hi: float = 0.9,
    lo: float = 0.1,
    step_range: tuple[int, int] | None = None,
    limit: int | None = None,
) -> pd.DataFrame:
    """Loss tokens on which the trainer and the engine are both confident and disagree: the trainer's
    p_old = exp(old_logprob) > hi and the engine's p = exp(rollout_logprob) < lo, or the reverse (a bf16 or
    temperature-mismatched sampler; SkyRL #2201: a small mean gap can hide such tokens). [step, sample_id,
    position, token_id, token, trainer_prob, engine_prob, mismatch], each token once (its first update),
    the largest |mismatch| first."""
    if not (0.0 < lo < hi < 1.0):
        raise ValueError(f"need 0 < lo < hi < 1 (probabilities), got lo={lo!r}, hi={hi!r}")
    w = token_where(step_range, True, None).add(SCORED)
    p_t, p_e = f"exp({TOK.old_logprob})", f"exp({TOK.rollout_logprob})"
    w.add(f"(({p_t} > ? AND {p_e} < ?) OR ({p_t} < ? AND {p_e} > ?))", hi, lo, lo, hi)
    q = (
        f"SELECT {TOK.step}, {TOK.sample_id}, {TOK.position}, {TOK.token_id}, {TOK.token}, "
        f"{p_t} AS trainer_prob, {p_e} AS engine_prob, {MISMATCH} AS mismatch FROM tokens{w.sql()} "
        f"QUALIFY row_number() OVER (PARTITION BY {TOK.step}, {TOK.sample_id}, {TOK.position} "
        f"ORDER BY {TOK.update_id}, {TOK.rank}) = 1 "
        f"ORDER BY abs(mismatch) DESC, {TOK.step}, {TOK.sample_id}, {TOK.position}"
    )
    if limit is not None:
        return run.sql(q + " LIMIT ?", w.params + [int(limit)])
    return run.sql(q, w.params)
