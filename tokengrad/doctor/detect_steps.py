"""Detectors on the steps table: entropy collapse, KL blow-up and clip saturation (the run's health on the
same table: tokengrad.doctor.detect_health).

Every default is a module constant with its source; "tokengrad default" marks a value chosen here where no
published number exists (docs/doctor.md lists them all).
"""

from __future__ import annotations

import numpy as np

from tokengrad.doctor.finding import Action, Finding, NotChecked
from tokengrad.doctor.registry import detector, fmt, pct, window_medians
from tokengrad.doctor.stats import confidence_from_p, sustained, sustained_confidence, trend
from tokengrad.doctor.thresholds import TREND_ALPHA
from tokengrad.doctor.view import RunView
from tokengrad.schema import STEP

# Entropy collapse (Cui et al., arXiv 2505.22617: entropy falls sharply early in RL and performance then
# saturates, R = -a exp(H) + b): end-window median below ENTROPY_DROP x the start-window median, falling.
ENTROPY_DROP = 0.5  # tokengrad default: half of the starting entropy
ENTROPY_CRITICAL = 0.1  # tokengrad default: a tenth of it is left
# KL to the reference, nats per token. PPO practice keeps the approximate KL per update near 0.01-0.05
# (OpenAI Spinning Up PPO target_kl = 0.01; Huang et al. "The 37 implementation details of PPO", ICLR blog
# track 2022); a per-token KL to the reference above 1 nat means the policy has left it.
KL_WARNING = 0.1
KL_CRITICAL = 1.0
KL_SUSTAIN = 3  # consecutive steps (tokengrad default)
# Clip fraction: healthy PPO runs clip about 0.1-0.2 of the tokens (Huang et al. 2022 above).
CLIP_WARNING = 0.2
CLIP_CRITICAL = 0.5
CLIP_SUSTAIN = 5

_SPINNING_UP = "OpenAI Spinning Up, PPO (target_kl); Huang et al. 2022, The 37 implementation details of PPO"


@detector("entropy_collapse", tables=("steps",))
def entropy_collapse(view: RunView) -> list[Finding]:
    """Mean token entropy falls to a fraction of its start (Mann-Kendall falling, end/start medians)."""
    steps, h = view.need(STEP.entropy_mean, "token entropy")
    if h.size < 10:
        raise NotChecked(f"{h.size} steps record the entropy, the trend needs 10")
    start, end, w = window_medians(h)
    tr = trend(h, steps)
    if start <= 0 or not tr.falling(TREND_ALPHA) or end >= ENTROPY_DROP * start:
        return []
    ratio = end / start
    below = np.convolve(h < ENTROPY_DROP * start, np.ones(w), "valid") == w  # w steps in a row below
    onset = int(steps[np.argmax(below)]) if below.any() else int(steps[-w])
    projected = None
    if tr.slope < 0:
        projected = int(steps[0] + (ENTROPY_CRITICAL * start - h[0]) / tr.slope)
    critical = ratio < ENTROPY_CRITICAL
    msg = (
        f"entropy fell from {fmt(start)} to {fmt(end)} nats ({pct(ratio)} of the start) from step {onset}; "
        f"Mann-Kendall tau {tr.tau:.2f}, p {tr.p_value:.1e}"
        + (f"; at this slope it reaches {pct(ENTROPY_CRITICAL)} at step {projected}" if not critical else "")
    )
    return [
        Finding(
            id="entropy_collapse",
            severity="critical" if critical else "warning",
            confidence=confidence_from_p(tr.p_value),
            first_step=onset,
            last_step=int(steps[-1]),
            message=msg,
            evidence={
                "statistic": "end/start window medians of entropy_mean; Mann-Kendall trend, Theil-Sen slope",
                "values": {"start": start, "end": end, "ratio": ratio, "window": w, **tr.as_dict()},
                "thresholds": {"drop": ENTROPY_DROP, "critical": ENTROPY_CRITICAL, "alpha": TREND_ALPHA},
                "projected_step": projected,
            },
            actions=(
                Action(
                    "add an entropy bonus or raise eps_high (clip-higher)", "DAPO, arXiv 2503.14476 Sec. 3.1"
                ),
                Action("clip or KL-penalise high-covariance tokens (Clip-Cov / KL-Cov)", "arXiv 2505.22617"),
            ),
        )
    ]


def _sustained_finding(view, name, column, *, warn, crit, k, unit, actions, source) -> list[Finding]:
    """A finding when `column` stays above `warn` (critical: `crit`) for k consecutive recorded steps."""
    steps, x = view.need(column)
    for level, threshold in (("critical", crit), ("warning", warn)):
        run = sustained(x > threshold, k)
        if run is None:
            continue
        a, b = run
        peak = float(np.max(x[a:b]))
        msg = (
            f"{column} above {fmt(threshold)}{unit} for {b - a} steps in a row from step {int(steps[a])} "
            f"(peak {fmt(peak)}{unit}, run median {fmt(float(np.median(x)))})"
        )
        evidence = {
            "statistic": f"sustained threshold: {k} consecutive steps above the threshold",
            "values": {"peak": peak, "streak": b - a, "median": float(np.median(x))},
            "thresholds": {"warning": warn, "critical": crit, "sustain": k},
            "source": source,
        }
        conf = sustained_confidence(b - a, k, peak, threshold)
        return [
            Finding(
                id=name,
                severity=level,
                confidence=conf,
                first_step=int(steps[a]),
                last_step=int(steps[b - 1]),
                message=msg,
                evidence=evidence,
                actions=actions,
            )
        ]
    return []


@detector("kl_blowup", tables=("steps",))
def kl_blowup(view: RunView) -> list[Finding]:
    """KL to the reference stays above 0.1 nats (critical: 1 nat) for 3 steps."""
    if view.settings.beta == 0 and view.column(STEP.kl) is None:
        raise NotChecked("beta = 0: the run has no KL to a reference model")
    actions = (
        Action("raise beta or lower the learning rate", _SPINNING_UP),
        Action("check the reference model and the KL estimator (k3)", "Schulman 2020, Approximating KL"),
    )
    return _sustained_finding(
        view,
        "kl_blowup",
        STEP.kl,
        warn=KL_WARNING,
        crit=KL_CRITICAL,
        k=KL_SUSTAIN,
        unit=" nats",
        actions=actions,
        source=_SPINNING_UP,
    )


@detector("clip_saturation", tables=("steps",))
def clip_saturation(view: RunView) -> list[Finding]:
    """The PPO clip removes the gradient of over 20 % of the tokens (critical: 50 %) for 5 steps."""
    actions = (
        Action(
            "lower the learning rate or num_iterations; widen eps_high", "DAPO, arXiv 2503.14476 Sec. 3.1"
        ),
    )
    return _sustained_finding(
        view,
        "clip_saturation",
        STEP.clip_frac,
        warn=CLIP_WARNING,
        crit=CLIP_CRITICAL,
        k=CLIP_SUSTAIN,
        unit="",
        actions=actions,
        source=_SPINNING_UP,
    )
