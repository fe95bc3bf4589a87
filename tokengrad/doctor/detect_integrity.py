"""Integrity: the recorded per-token data itself is wrong, not the training. Silent corruptions users met in
2026 (shared docs, ecosystem-2026 Sec. 2, items 7-9): engine log-probs padded with 0.0 (verifiers PR #2078),
fake train/rollout gaps on tool tokens (miles PR #2476), per-token weights truncated to 0 (tinker-cloud PR
#65); token counts that disagree with the loss mask (NaN or constant rewards: doctor/detect_rewards.py).
Each detector names the steps, samples and tokens; a run without the column it reads is reported as
"not checked" (NotChecked), never as healthy."""

from __future__ import annotations

import pandas as pd

from tokengrad.doctor.finding import Action, Finding, NotChecked, TokenEvidence
from tokengrad.doctor.registry import detector, fmt, pct
from tokengrad.doctor.view import RunView
from tokengrad.schema import STEP, TOK

# A sequence's log-probs are "constant" when at least CONST_MIN_TOKENS loss tokens hold one value while
# another log-prob column of the same tokens spans more than CONST_SPREAD nats: a real policy that is sure
# of every token (all log-probs ~0) is sure under every column, so only a filled-in column is flat then.
CONST_MIN_TOKENS = 4
CONST_SPREAD = 0.5
# A fake gap: a loss token whose rollout log-prob is missing or exactly 0 (p = 1) while the trainer's is
# below -1 nat (p < 0.37): a 1-nat gap on one token is 50-100x the real 0.01-0.02 mismatch miles PR #2476
# measured. Warning from 1 % of a step's loss tokens, critical from 10 % (tokengrad defaults).
GAP_TRAINER = -1.0
GAP_WARNING = 0.01
GAP_CRITICAL = 0.1
# A reward that never varies: one value over at least this many steps and groups (tokengrad defaults).
ZEROED_CRITICAL = 0.5  # share of a step's sequences with IS weight 0 and no mask (tokengrad default)
_SHOWN = 10  # evidence rows per finding
_LOGPROBS = (TOK.logprob, TOK.old_logprob, TOK.rollout_logprob, TOK.ref_logprob)
_SEQUENCE = f"{TOK.step}, {TOK.rank}, {TOK.update_id}, {TOK.sample_id}"  # one sequence's token rows
_TOKEN_ACTION = Action(
    "check how the integration fills missing log-probs (never with 0.0, which reads as p = 1)",
    "verifiers PR #2078; miles PR #2476",
)


def _need_tokens(view: RunView, *cols: str) -> None:
    if not view.has_tokens:
        raise NotChecked("the run has no token rows")
    for col in cols:
        if not view.has_token_columns(col):
            raise NotChecked(f"the tokens table has no {col}")
        if view.sql(f"SELECT count({col}) AS n FROM tokens")["n"].iloc[0] == 0:
            raise NotChecked(f"no token row records {col}")


def _flat_sequences(view: RunView, col: str, other: str) -> pd.DataFrame:
    """Loss-token sequences whose `col` holds one value while `other` spans more than CONST_SPREAD."""
    return view.sql(
        f"SELECT {TOK.step}, {TOK.sample_id}, min({col}) AS value, count(*) AS n, "
        f"max({other}) - min({other}) AS spread "
        f"FROM tokens WHERE {TOK.in_loss} AND {col} IS NOT NULL AND {other} IS NOT NULL "
        f"GROUP BY {_SEQUENCE} "
        f"HAVING count(*) >= {CONST_MIN_TOKENS} AND min({col}) = max({col}) "
        f"AND max({other}) - min({other}) > {CONST_SPREAD} ORDER BY {TOK.step}, {TOK.sample_id}"
    )


@detector("logprob_constant", page="inspector", tables=("tokens",), about="data")
def logprob_constant(view: RunView) -> list[Finding]:
    """A log-prob column is one value (often 0.0) over a whole sequence while another column varies:
    zero-filled or constant log-probs, which corrupt the ratio and the IS weight."""
    _need_tokens(view, TOK.logprob)
    present = [c for c in _LOGPROBS if view.has_token_columns(c)]
    counts = view.sql("SELECT " + ", ".join(f"count({c}) AS {c}" for c in present) + " FROM tokens")
    cols = [c for c in present if counts[c].iloc[0]]  # the log-prob columns some token row records
    if len(cols) < 2:
        raise NotChecked("the token rows record one log-prob column (logprob); the check compares two")
    out = []
    for col in cols:
        other = TOK.old_logprob if col == TOK.logprob else TOK.logprob
        if other not in cols:
            continue
        flat = _flat_sequences(view, col, other)
        if flat.empty:
            continue
        total = view.sql(
            f"SELECT count(DISTINCT ({_SEQUENCE})) AS n FROM tokens WHERE {TOK.in_loss} AND {col} IS NOT NULL"
        )["n"].iloc[0]
        share = len(flat) / max(int(total), 1)
        values = sorted({float(v) for v in flat["value"]})[:5]
        msg = (
            f"{col} is one value ({', '.join(fmt(v) for v in values)}) over every loss token of {len(flat)} "
            f"sequence(s) ({pct(share)}), first step {int(flat[STEP.step].iloc[0])} sample "
            f"{int(flat[TOK.sample_id].iloc[0])}, while {other} spans up to {fmt(flat['spread'].max())} nats"
        )
        evidence = {
            "statistic": f"sequences of >= {CONST_MIN_TOKENS} loss tokens with one {col} value while {other} "
            f"spans > {CONST_SPREAD} nats",
            "values": {"column": col, "sequences": len(flat), "share": share, "constant_values": values},
            "thresholds": {"min_tokens": CONST_MIN_TOKENS, "spread": CONST_SPREAD, "critical_share": 0.5},
        }
        level = "critical" if share >= 0.5 else "warning"
        first, last = int(flat[STEP.step].min()), int(flat[STEP.step].max())
        out.append(
            Finding(
                id="logprob_constant",
                severity=level,
                confidence=1.0,
                first_step=first,
                last_step=last,
                message=msg,
                evidence=evidence,
                tokens=TokenEvidence.from_rows(flat),
                actions=(_TOKEN_ACTION,),
            )
        )
    return out


def _fake_gaps(view: RunView) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The steps where at least GAP_WARNING of the loss tokens are fake gaps (step, n, fake, share) and the
    first fake-gap tokens of those steps (evidence rows): a rollout log-prob null, NaN or exactly 0 while
    the trainer's (old_logprob, else logprob) is below GAP_TRAINER."""
    _need_tokens(view, TOK.rollout_logprob)
    trainer = f"coalesce({TOK.old_logprob}, {TOK.logprob})"
    roll = TOK.rollout_logprob
    gone = f"{roll} IS NULL OR NOT isfinite({roll}) OR {roll} = 0"
    fake = f"({gone}) AND {trainer} < {GAP_TRAINER}"
    per = view.sql(
        f"SELECT {TOK.step}, count(*) AS n, sum(CASE WHEN {fake} THEN 1 ELSE 0 END) AS fake "
        f"FROM tokens WHERE {TOK.in_loss} GROUP BY {TOK.step} ORDER BY {TOK.step}"
    )
    per["share"] = per["fake"] / per["n"]
    bad = per[per["share"] >= GAP_WARNING]
    if bad.empty:
        return bad, pd.DataFrame()
    where = f"{TOK.step}, {TOK.sample_id}, {TOK.position}"
    toks = view.sql(
        f"SELECT {where}, {TOK.token_id}, {TOK.token}, {roll}, {trainer} AS trainer "
        f"FROM tokens WHERE {TOK.in_loss} AND {fake} AND {TOK.step} BETWEEN ? AND ? "
        f"ORDER BY {where} LIMIT {_SHOWN}",
        [int(bad[STEP.step].min()), int(bad[STEP.step].max())],
    )
    return bad, toks


@detector("rollout_logprob_gap", page="inspector", tables=("tokens",), about="data")
def rollout_logprob_gap(view: RunView) -> list[Finding]:
    """Loss tokens whose rollout log-prob is missing or exactly 0 while the trainer's is below -1 nat:
    fake train/rollout gaps (tool or env tokens in the loss mask, engine log-probs padded with 0)."""
    bad, toks = _fake_gaps(view)
    if bad.empty:
        return []
    worst = bad.loc[bad["share"].idxmax()]
    roll = TOK.rollout_logprob
    missing = int(toks[roll].isna().sum())
    msg = (
        f"{int(bad['fake'].sum())} loss tokens over {len(bad)} step(s) have a rollout log-prob that is "
        f"missing or exactly 0 while the trainer's is below {fmt(GAP_TRAINER)} nat (worst: step "
        f"{int(worst[STEP.step])}, {pct(float(worst['share']))} of its loss tokens): a fake gap, e.g. tool "
        "output in the loss mask or engine log-probs padded with 0"
    )
    evidence = {
        "statistic": "share of a step's loss tokens with rollout_logprob null/NaN/0 and trainer log-prob "
        f"< {GAP_TRAINER}",
        "values": {
            "tokens": int(bad["fake"].sum()),
            "steps": bad[STEP.step].astype(int).tolist()[:20],
            "worst_share": float(worst["share"]),
            "missing_in_shown": missing,
        },
        "thresholds": {"trainer": GAP_TRAINER, "warning": GAP_WARNING, "critical": GAP_CRITICAL},
    }
    level = "critical" if float(worst["share"]) >= GAP_CRITICAL else "warning"
    actions = (
        _TOKEN_ACTION,
        Action("keep tool and environment tokens out of the loss mask", "miles PR #2476"),
    )
    first, last = int(bad[STEP.step].min()), int(bad[STEP.step].max())
    return [
        Finding(
            id="rollout_logprob_gap",
            severity=level,
            confidence=1.0,
            first_step=first,
            last_step=last,
            message=msg,
            evidence=evidence,
            tokens=TokenEvidence.from_rows(toks),
            actions=actions,
        )
    ]


def _zeroed_sequences(view: RunView) -> pd.DataFrame:
    """Sequences whose every loss token has IS weight 0 and none was masked on purpose (tokens.masked)."""
    return view.sql(
        f"SELECT {TOK.step}, {TOK.sample_id}, count(*) AS n, "
        f"bool_or(coalesce({TOK.masked}, false)) AS {TOK.masked} "
        f"FROM tokens WHERE {TOK.in_loss} AND {TOK.is_weight} IS NOT NULL GROUP BY {_SEQUENCE} "
        f"HAVING max(abs({TOK.is_weight})) = 0 ORDER BY {TOK.step}, {TOK.sample_id}"
    )


@detector("is_weight_zeroed", page="inspector", tables=("tokens", "steps"), about="data")
def is_weight_zeroed(view: RunView) -> list[Finding]:
    """Whole sequences whose IS weight is 0 on every loss token with no mask to say why (weights cast to
    int, truncation gone wrong): their gradient is silently gone."""
    _need_tokens(view, TOK.is_weight)
    zero = _zeroed_sequences(view)
    records_masks = view.sql(f"SELECT count({TOK.masked}) AS n FROM tokens")["n"].iloc[0] > 0
    if records_masks:
        zero = zero[~zero[TOK.masked]]
    per = zero.groupby(STEP.step).size()
    if not records_masks and STEP.is_masked_sequences in view.steps.columns:  # the host's own count
        told = view.steps.set_index(STEP.step)[STEP.is_masked_sequences].reindex(per.index).fillna(0)
        per = (per - told).clip(lower=0)
    per = per[per > 0]
    if per.empty:
        return []
    zero = zero[zero[STEP.step].isin(per.index)]
    seqs = view.sql(
        f"SELECT {TOK.step}, count(DISTINCT ({TOK.rank}, {TOK.update_id}, {TOK.sample_id})) AS n "
        f"FROM tokens WHERE {TOK.in_loss} AND {TOK.is_weight} IS NOT NULL GROUP BY {TOK.step}"
    ).set_index(TOK.step)["n"]
    share = (per / seqs.reindex(per.index)).fillna(0)
    msg = (
        f"{int(per.sum())} sequence(s) over {len(per)} step(s) have IS weight 0 on every loss token and no "
        f"mask recorded for it (worst: step {int(share.idxmax())}, {pct(float(share.max()))} of its "
        "sequences): their gradient is silently removed"
    )
    evidence = {
        "statistic": "sequences whose every loss token has is_weight == 0, not masked",
        "values": {"sequences": int(per.sum()), "steps": [int(s) for s in per.index[:20]]},
        "thresholds": {"critical_share": ZEROED_CRITICAL},
    }
    level = "critical" if float(share.max()) >= ZEROED_CRITICAL else "warning"
    actions = (
        Action("check the weights' dtype (a cast to int truncates w < 1 to 0)", "tinker-cloud PR #65"),
    )
    first, last = int(per.index.min()), int(per.index.max())
    return [
        Finding(
            id="is_weight_zeroed",
            severity=level,
            confidence=1.0,
            first_step=first,
            last_step=last,
            message=msg,
            evidence=evidence,
            tokens=TokenEvidence.from_rows(zero),
            actions=actions,
        )
    ]


@detector("token_count_mismatch", tables=("steps", "tokens"), about="data")
def token_count_mismatch(view: RunView) -> list[Finding]:
    """steps.n_tokens disagrees with the token rows in the loss mask, on steps that kept every row (no
    token budget): the loss was normalised over other tokens than the ones recorded."""
    _need_tokens(view)
    if view.column(STEP.n_tokens) is None:
        raise NotChecked("the steps table has no n_tokens")
    key = f"{STEP.step}, {STEP.rank}"  # a step's rows on one rank (tokens and steps alike)
    whole = view.sql(
        f"SELECT count(*) AS n FROM (SELECT {key}, count({TOK.selected_by}) AS b FROM tokens "
        f"GROUP BY {key}) WHERE b = 0"
    )["n"].iloc[0]
    if not whole:
        raise NotChecked("every step kept a token budget: its rows are not the whole loss mask")
    n, rows = f"s.{STEP.n_tokens}", f"s.{STEP.n_token_rows}"
    df = view.sql(
        # a token trained in several updates (mu > 1) has a row per update; n_tokens counts it once
        f"WITH t AS (SELECT {key}, count(*) AS rows, "
        f"count(DISTINCT CASE WHEN {TOK.in_loss} THEN ({TOK.sample_id}, {TOK.position}) END) AS in_mask, "
        f"count({TOK.selected_by}) AS budgeted FROM tokens GROUP BY {key}) "
        f"SELECT s.{STEP.step}, s.{STEP.rank}, {n}, {rows}, t.rows, t.in_mask FROM steps s JOIN t "
        f"USING ({key}) WHERE t.budgeted = 0 AND {n} IS NOT NULL"  # t is cut at view.upto
        f" AND ({rows} IS NULL OR {rows} = t.rows) AND {n} <> t.in_mask "
        f"ORDER BY s.{STEP.step}, s.{STEP.rank}"
    )
    if df.empty:
        return []
    first = df.iloc[0]
    msg = (
        f"{len(df)} step(s) record n_tokens unlike their loss-mask token rows, first step "
        f"{int(first[STEP.step])}: n_tokens {int(first[STEP.n_tokens])}, "
        f"{int(first['in_mask'])} rows in the mask"
    )
    evidence = {
        "statistic": "steps.n_tokens vs distinct in_loss (sample_id, position), steps without a budget",
        "values": {
            "steps": df[STEP.step].astype(int).tolist()[:20],
            "n_tokens": df[STEP.n_tokens].astype(int).tolist()[:20],
            "in_mask": df["in_mask"].astype(int).tolist()[:20],
        },
    }
    actions = (Action("pass st.track the same mask the loss is normalised by", "docs/api.md"),)
    first_step, last_step = int(df[STEP.step].min()), int(df[STEP.step].max())
    return [
        Finding(
            id="token_count_mismatch",
            severity="warning",
            confidence=1.0,
            first_step=first_step,
            last_step=last_step,
            message=msg,
            evidence=evidence,
            actions=actions,
        )  # step-level counts: the evidence names steps, no token
    ]
