"""Rollout-trainer mismatch: the sampler's log-probs drift away from the trainer's (steps.rollout_mismatch,
tokens.rollout_logprob, schema v3), and the share of sequences the host's masks remove whole (tokens.masked /
masked_by, else steps.is_masked_sequences over the step's completions; schema v4). Every column is optional:
a run without them gets no finding."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.doctor.finding import Action, Finding, NotChecked, TokenEvidence
from tokengrad.doctor.registry import detector, fmt, pct, window_medians
from tokengrad.doctor.stats import confidence_from_p, sustained, sustained_confidence, trend
from tokengrad.doctor.thresholds import TREND_ALPHA
from tokengrad.doctor.view import RunView
from tokengrad.read import rollout_queries as rq
from tokengrad.schema import SAMPLE, STEP, TOK

# mean |log pi_old - log pi_rollout| per loss token, nats. ~1e-7 when the sampler is the trained fp32
# distribution (schema doc); bf16 inference engines show ~1e-3 to 1e-2 and off-policy trouble past that
# (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training", truncated
# importance sampling). Growth: the end-window median 10x the start's, rising.
MISMATCH_WARNING = 0.01
MISMATCH_CRITICAL = 0.1
MISMATCH_GROWTH = 10.0
MISMATCH_FLOOR = 1e-3  # growth below this level is numerical noise (tokengrad default)
MISMATCH_MIN_STEPS = 5  # steps the start and end windows need
MASKED_WARNING = 0.1  # tokengrad default: a tenth of the sequences masked
MASKED_SUSTAIN = 5
_SOURCE = "Yao et al. 2025, off-policy RL training from inference/training mismatch (truncated IS)"


def _worst_tokens(view: RunView, step: int, k: int = 5) -> tuple[TokenEvidence, ...]:
    if not view.has_token_columns(TOK.rollout_logprob, TOK.old_logprob):
        return ()
    gap = f"abs({TOK.old_logprob} - {TOK.rollout_logprob})"
    df = view.sql(
        f"SELECT {TOK.sample_id}, {TOK.position}, {TOK.token_id}, {TOK.token}, {TOK.prob}, {gap} AS gap "
        f"FROM tokens WHERE {TOK.step} = ? AND {TOK.in_loss} AND {TOK.rollout_logprob} IS NOT NULL "
        f"ORDER BY gap DESC, {TOK.sample_id}, {TOK.position} LIMIT {int(k)}",
        [int(step)],
    )
    total = view.sql(
        f"SELECT sum({gap}) AS s FROM tokens WHERE {TOK.step} = ? AND {TOK.in_loss}", [int(step)]
    )["s"].iloc[0]
    return tuple(
        _counted(step, r, float(r.gap / total) if total else None, i, r.prob)
        for i, r in enumerate(df.itertuples())
    )


def _counted(step: int, r, share: float | None, rank: int, prob=None) -> TokenEvidence:
    """A token row `r` (sample_id, position, token_id, token) as evidence with a counted (exact) share."""
    return TokenEvidence(
        step=step,
        sample_id=int(r.sample_id),
        position=int(r.position),
        token_id=int(r.token_id),
        text=str(r.token or ""),
        share=share,
        share_of="count",
        exact=True,
        prob=float(prob) if prob is not None else None,
        rank=rank,
    )


@detector("rollout_mismatch", tables=("steps", "tokens"), page="inspector")
def rollout_mismatch(view: RunView) -> list[Finding]:
    """rollout_mismatch above 0.01 nats (critical: 0.1) at the end, or growing tenfold (Mann-Kendall)."""
    col = view.column(STEP.rollout_mismatch)
    if col is None:
        raise NotChecked("the run records no rollout log-probs (steps.rollout_mismatch)")
    if col[1].size < MISMATCH_MIN_STEPS:
        raise NotChecked(f"{col[1].size} steps record rollout_mismatch, the trend needs {MISMATCH_MIN_STEPS}")
    steps, x = col
    start, end, w = window_medians(x)
    tr = trend(x, steps)
    growing = tr.rising(TREND_ALPHA) and end > MISMATCH_FLOOR and end >= MISMATCH_GROWTH * max(start, 1e-12)
    if end < MISMATCH_WARNING and not growing:
        return []
    level = "critical" if end >= MISMATCH_CRITICAL else "warning"
    worst = int(steps[np.argmax(x)])
    msg = (
        f"rollout/trainer log-prob mismatch {fmt(start)} -> {fmt(end)} nats per token (window medians)"
        + (f", growing (Mann-Kendall p {tr.p_value:.1e})" if growing else "")
        + f"; worst at step {worst} ({fmt(float(x.max()))})"
    )
    split = _staleness_apart(view)
    msg += split[0]
    evidence = {
        "statistic": "end/start window medians of rollout_mismatch; Mann-Kendall",
        "values": {"start": start, "end": end, "max": float(x.max()), **tr.as_dict(), **split[1]},
        "thresholds": {"warning": MISMATCH_WARNING, "critical": MISMATCH_CRITICAL, "growth": MISMATCH_GROWTH},
    }
    actions = (Action("correct with truncated importance sampling or sample in fp32", _SOURCE),)
    onset = int(steps[np.argmax(x >= MISMATCH_WARNING)]) if (x >= MISMATCH_WARNING).any() else int(steps[-w])
    conf = confidence_from_p(tr.p_value) if growing else 0.9
    return [
        Finding(
            id="rollout_mismatch",
            severity=level,
            confidence=conf,
            first_step=onset,
            last_step=int(steps[-1]),
            message=msg,
            evidence=evidence,
            tokens=_worst_tokens(view, worst),
            actions=actions,
        )
    ]


def _staleness_apart(view: RunView) -> tuple[str, dict]:
    """The message tail and evidence values that keep the engine mismatch apart from staleness
    (tokengrad.read.rollout_queries MISMATCH / STALENESS) where the run recorded policy versions."""
    if not view.has_token_columns(TOK.policy_version, TOK.trainer_version, TOK.rollout_logprob):
        return "", {}
    s = rq.gap_summary(view)
    values = {
        k: s[k] for k in ("mismatch_abs_mean", "token_mult_prob_error", "n_stale", "staleness_abs_mean")
    }
    if not s["n_stale"]:
        return "; no stale rows: the gap is the engine's mismatch alone", values
    return (
        f"; per token the engine mismatch is {fmt(s['mismatch_abs_mean'])} nats, apart from the staleness "
        f"of {int(s['n_stale'])} rows up to {int(s['lag_max'])} versions old ({fmt(s['staleness_abs_mean'])} "
        "nats, the policy's own drift)",
        values,
    )


# Confident disagreement: one side gives the sampled token p > 0.9 and the other p < 0.1, |d| > ln 9 = 2.2
# nats, where a bf16 engine's rounding stays below 0.1 nats (verl PR #7749, vime #64): a sampler at another
# temperature or precision, or wrong log-probs. tokengrad defaults: a warning from 3 such tokens making at
# least 0.1 % of the scored loss tokens, critical from 1 %.
CONFIDENT_HI, CONFIDENT_LO = 0.9, 0.1
CONFIDENT_MIN_TOKENS, CONFIDENT_WARNING, CONFIDENT_CRITICAL = 3, 0.001, 0.01


@detector("confident_disagreement", tables=("tokens",), page="inspector")
def confident_disagreement(view: RunView) -> list[Finding]:
    """Loss tokens where the trainer's pi_old gives p > 0.9 and the engine p < 0.1, or the reverse."""
    if not view.has_token_columns(TOK.rollout_logprob, TOK.old_logprob):
        raise NotChecked("the run records no rollout log-probs (tokens.rollout_logprob, old_logprob)")
    n_scored = rq.gap_summary(view)["n_scored"]
    if not n_scored:
        raise NotChecked("no loss token has both a rollout and a trainer log-prob")
    hits = rq.confident_disagreements(view, hi=CONFIDENT_HI, lo=CONFIDENT_LO)
    if len(hits) < CONFIDENT_MIN_TOKENS or len(hits) / n_scored < CONFIDENT_WARNING:
        return []
    share = len(hits) / n_scored
    level = "critical" if share >= CONFIDENT_CRITICAL else "warning"
    steps = hits[TOK.step].to_numpy()
    top = hits.head(5)
    ints = (TOK.step, TOK.sample_id, TOK.position, TOK.token_id)
    rows = [
        {k: (int(v) if k in ints else v) for k, v in r.items()}
        for r in top[[*ints, TOK.token, "trainer_prob", "engine_prob"]].astype(object).to_dict("records")
    ]
    worst = rows[0]
    msg = (
        f"{len(hits)} of {int(n_scored)} scored loss tokens ({pct(share)}) have the trainer and the engine "
        f"confident and opposed (p > {CONFIDENT_HI:g} on one side, < {CONFIDENT_LO:g} on the other), steps "
        f"{int(steps.min())}-{int(steps.max())}; worst at step {worst[TOK.step]} sample "
        f"{worst[TOK.sample_id]} position {worst[TOK.position]}: trainer p {worst['trainer_prob']:.3g}, "
        f"engine p {worst['engine_prob']:.3g}"
    )
    evidence = {
        "statistic": "count of loss tokens with exp(old_logprob) and exp(rollout_logprob) on opposite sides",
        "values": {"n_tokens": len(hits), "n_scored": int(n_scored), "share": share, "tokens": rows},
        "thresholds": {"hi": CONFIDENT_HI, "lo": CONFIDENT_LO, "warning": CONFIDENT_WARNING},
        "exact": True,
    }
    tokens = tuple(
        _counted(int(r.step), r, 1.0 / len(hits), i, r.trainer_prob) for i, r in enumerate(top.itertuples())
    )
    actions = (
        Action(
            "sample and score at the same temperature and precision; check the engine's log-probs", _SOURCE
        ),
    )
    conf = min(0.99, 0.7 + 10 * share)
    first, last = int(steps.min()), int(steps.max())
    return [
        Finding(
            id="confident_disagreement",
            severity=level,
            confidence=conf,
            first_step=first,
            last_step=last,
            message=msg,
            evidence=evidence,
            tokens=tokens,
            actions=actions,
        )
    ]


def masked_per_sequence(view: RunView) -> pd.DataFrame:
    """[step, sample_id, masked, reasons, token_id, token, position]: one row per recorded sequence, masked
    when a host mask removed the gradient of every one of its loss tokens (tokens.masked, the TRL attach's
    record of its IS sequence/token masks, off-policy mask and entropy mask; schema.MASK_REASONS), with the
    reasons met on it and its first loss token. Empty for a run without mask records. A budgeted step's
    rows kept only as top tokens are left out: a part of a sequence is not the sequence."""
    if not view.has_token_columns(TOK.masked, TOK.masked_by):
        return pd.DataFrame()
    n = view.sql(f"SELECT count({TOK.masked}) AS n FROM tokens")["n"]
    if not len(n) or not n.iloc[0]:  # mask information never recorded
        return pd.DataFrame()
    whole = (  # the selected_by values of rows that keep whole sequences (schema TOKENS)
        f"coalesce({TOK.selected_by}, 'all') IN ('all', 'sequence')"
        if view.has_token_columns(TOK.selected_by)
        else "true"
    )
    step, sample = TOK.step, TOK.sample_id
    return view.sql(  # one row per sequence, named as its tokens' columns
        f"SELECT {step}, {sample}, bool_and(coalesce({TOK.masked}, false)) AS {TOK.masked}, "
        f"string_agg(DISTINCT {TOK.masked_by}, '+') AS reasons, "
        f"arg_min({TOK.token_id}, {TOK.position}) AS {TOK.token_id}, "
        f"arg_min({TOK.token}, {TOK.position}) AS {TOK.token}, min({TOK.position}) AS {TOK.position} "
        f"FROM tokens WHERE {TOK.in_loss} AND {whole} GROUP BY {step}, {sample} ORDER BY {step}, {sample}"
    )


def _masked_share(view: RunView) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """([step, n, masked] per step, the per-sequence rows (may be empty), the source column)."""
    seq = masked_per_sequence(view)
    if not seq.empty:
        per = seq.groupby(TOK.step, as_index=False).agg(
            n=(TOK.sample_id, "size"), **{TOK.masked: (TOK.masked, "sum")}
        )
        return per, seq, f"tokens.{TOK.masked}"
    col, samples = view.column(STEP.is_masked_sequences), view.samples
    if col is None or samples.empty:  # TRL's IS-mask count alone, over the step's completions
        return pd.DataFrame(), seq, ""
    n = samples.groupby(SAMPLE.step).size()
    per = pd.DataFrame({TOK.step: col[0], TOK.masked: col[1]}).assign(n=lambda d: d[TOK.step].map(n))
    return per.dropna(subset=["n"]), seq, f"steps.{STEP.is_masked_sequences}"


def _masked_evidence(seq: pd.DataFrame, step: int, n: int) -> tuple[TokenEvidence, ...]:
    """The masked sequences of `step` (at most 5), each by its first loss token; share: 1 / sequences."""
    if seq.empty:
        return ()
    hit = seq[(seq[TOK.step] == step) & seq[TOK.masked]].head(5)
    return tuple(_counted(step, r, 1.0 / n, i) for i, r in enumerate(hit.itertuples()))


@detector("masked_sequences", tables=("steps", "tokens", "samples"), page="inspector")
def masked_sequences(view: RunView) -> list[Finding]:
    """Host masks (TRL's IS sequence/token mask, off-policy mask, entropy mask) remove the whole gradient of
    over 10 % of a step's sequences for 5 steps in a row (tokens.masked, else steps.is_masked_sequences)."""
    per, seq, source = _masked_share(view)
    if per.empty:
        raise NotChecked(
            "the run records no sequence mask (tokens.masked, or steps.is_masked_sequences with samples)"
        )
    steps, x = per[TOK.step].to_numpy(), (per[TOK.masked] / per["n"]).to_numpy(dtype=float)
    run = sustained(x > MASKED_WARNING, MASKED_SUSTAIN)
    if run is None:
        return []
    a, b = run
    first, peak = int(steps[a]), float(x[a:b].max())
    window = seq[seq[TOK.step].between(first, int(steps[b - 1])) & seq[TOK.masked]] if not seq.empty else seq
    reasons = (
        window["reasons"].dropna().str.split("+").explode().value_counts().to_dict() if not seq.empty else {}
    )
    why = ", ".join(f"{k} {v}" for k, v in reasons.items())
    msg = (
        f"{pct(float(x[a]))} of step {first}'s sequences lost their whole gradient to a mask, above "
        f"{pct(MASKED_WARNING)} for {b - a} steps (peak {pct(peak)}; from {source})"
        + (f"; masked sequences by reason: {why}" if why else "")
    )
    evidence = {
        "statistic": "sustained threshold on the share of sequences whose every loss token is masked",
        "values": {"source": source, "first": float(x[a]), "peak": peak, "streak": b - a, "reasons": reasons},
        "thresholds": {"warning": MASKED_WARNING, "sustain": MASKED_SUSTAIN},
        "exact": True,
    }
    actions = (
        Action("lower the mismatch: same precision and sampler for rollout and training", _SOURCE),
        Action("or raise the IS cap / off-policy threshold so fewer sequences are dropped", _SOURCE),
    )
    conf = sustained_confidence(b - a, MASKED_SUSTAIN, peak, MASKED_WARNING)
    tokens = _masked_evidence(seq, first, int(per["n"].iloc[a]))
    last = int(steps[b - 1])
    return [
        Finding(
            id="masked_sequences",
            severity="warning",
            confidence=conf,
            first_step=first,
            last_step=last,
            message=msg,
            evidence=evidence,
            tokens=tokens,
            actions=actions,
        )
    ]
