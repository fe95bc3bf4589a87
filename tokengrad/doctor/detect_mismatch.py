"""Rollout-trainer mismatch: the sampler's log-probs drift away from the trainer's (steps.rollout_mismatch,
tokens.rollout_logprob, schema v3), and the share of sequences a mismatch correction masks out (any steps
column whose name starts with "masked", as a share in [0, 1]). Every column is optional: a run without
them gets no finding."""

from __future__ import annotations

import numpy as np

from tokengrad.doctor.detect_steps import TREND_ALPHA, _ends
from tokengrad.doctor.finding import Action, Finding, TokenEvidence
from tokengrad.doctor.registry import detector, fmt, pct
from tokengrad.doctor.stats import confidence_from_p, sustained, trend
from tokengrad.doctor.view import RunView

# mean |log pi_old - log pi_rollout| per loss token, nats. ~1e-7 when the sampler is the trained fp32
# distribution (schema doc); bf16 inference engines show ~1e-3 to 1e-2 and off-policy trouble past that
# (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training", truncated
# importance sampling). Growth: the end-window median 10x the start's, rising.
MISMATCH_WARNING = 0.01
MISMATCH_CRITICAL = 0.1
MISMATCH_GROWTH = 10.0
MISMATCH_FLOOR = 1e-3  # growth below this level is numerical noise (tokengrad default)
MASKED_WARNING = 0.1  # tokengrad default: a tenth of the sequences masked
MASKED_SUSTAIN = 5
_SOURCE = "Yao et al. 2025, off-policy RL training from inference/training mismatch (truncated IS)"


def _worst_tokens(view: RunView, step: int, k: int = 5) -> tuple[TokenEvidence, ...]:
    if not {"rollout_logprob", "old_logprob"} <= view.token_columns():
        return ()
    df = view.sql(
        "SELECT sample_id, position, token_id, token, prob, abs(old_logprob - rollout_logprob) AS gap "
        "FROM tokens WHERE step = ? AND in_loss AND rollout_logprob IS NOT NULL "
        f"ORDER BY gap DESC, sample_id, position LIMIT {int(k)}",
        [int(step)],
    )
    total = view.sql(
        "SELECT sum(abs(old_logprob - rollout_logprob)) AS s FROM tokens WHERE step = ? AND in_loss",
        [int(step)],
    )["s"].iloc[0]
    return tuple(
        TokenEvidence(
            step=step,
            sample_id=int(r.sample_id),
            position=int(r.position),
            token_id=int(r.token_id),
            text=str(r.token or ""),
            share=float(r.gap / total) if total else None,
            share_of="count",
            exact=True,
            prob=float(r.prob) if r.prob is not None else None,
            rank=i,
        )
        for i, r in enumerate(df.itertuples())
    )


@detector("rollout_mismatch", tables=("steps", "tokens"), page="inspector")
def rollout_mismatch(view: RunView) -> list[Finding]:
    """rollout_mismatch above 0.01 nats (critical: 0.1) at the end, or growing tenfold (Mann-Kendall)."""
    col = view.column("rollout_mismatch")
    if col is None or col[1].size < 5:
        return []
    steps, x = col
    start, end, w = _ends(x)
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
    evidence = {
        "statistic": "end/start window medians of rollout_mismatch; Mann-Kendall",
        "values": {"start": start, "end": end, "max": float(x.max()), **tr.as_dict()},
        "thresholds": {"warning": MISMATCH_WARNING, "critical": MISMATCH_CRITICAL, "growth": MISMATCH_GROWTH},
    }
    actions = (Action("correct with truncated importance sampling or sample in fp32", _SOURCE),)
    onset = int(steps[np.argmax(x >= MISMATCH_WARNING)]) if (x >= MISMATCH_WARNING).any() else int(steps[-w])
    conf = confidence_from_p(tr.p_value) if growing else 0.9
    return [
        Finding(
            "rollout_mismatch",
            level,
            conf,
            onset,
            int(steps[-1]),
            msg,
            evidence,
            _worst_tokens(view, worst),
            actions,
        )
    ]


@detector("masked_sequences", tables=("steps",))
def masked_sequences(view: RunView) -> list[Finding]:
    """A mismatch correction masks over 10 % of the sequences for 5 steps (steps columns masked*)."""
    out = []
    for name in sorted(c for c in view.steps.columns if str(c).startswith("masked")):
        col = view.column(name)
        if col is None or not (0 <= np.nanmin(col[1]) and np.nanmax(col[1]) <= 1):
            continue
        steps, x = col
        run = sustained(x > MASKED_WARNING, MASKED_SUSTAIN)
        if run is None:
            continue
        a, b = run
        msg = (
            f"{name} above {pct(MASKED_WARNING)} for {b - a} steps from step {int(steps[a])} "
            f"(peak {pct(x[a:b].max())})"
        )
        evidence = {
            "statistic": "sustained threshold on the masked-sequence share",
            "values": {"column": name, "peak": float(x[a:b].max()), "streak": b - a},
            "thresholds": {"warning": MASKED_WARNING, "sustain": MASKED_SUSTAIN},
        }
        actions = (
            Action("lower the mismatch: same precision and sampler for rollout and training", _SOURCE),
        )
        out.append(
            Finding(
                "masked_sequences",
                "warning",
                min(0.99, 0.5 + 0.05 * (b - a)),
                int(steps[a]),
                int(steps[b - 1]),
                msg,
                evidence,
                actions=actions,
            )
        )
    return out
