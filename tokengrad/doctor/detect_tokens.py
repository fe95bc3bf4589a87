"""Token-level detectors only a per-token record can make: a gradient spike with its culprit tokens,
low-probability dominance of the update, high-probability drag, a weighting rule that zeroes gradients."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.doctor.culprits import culprits, lead_first, summarize
from tokengrad.doctor.finding import Action, Finding, NotChecked, share_note
from tokengrad.doctor.registry import detector, fmt, pct
from tokengrad.doctor.spike_rule import SPIKE_MIN_STEPS, SPIKE_Z, robust_z
from tokengrad.doctor.stats import confidence_from_excess, sign_test_greater, trend
from tokengrad.doctor.thresholds import TREND_ALPHA
from tokengrad.doctor.view import RunView
from tokengrad.doctor.whatif_actions import dominance_action, has_rows_at, spike_action
from tokengrad.read.headline import DEFINITION, UPDATE_SHARE_NAME, low_prob_label, low_prob_shares
from tokengrad.schema import BUCKET, LAYER, REPLAY_K, RESIDUAL_BUCKET, STEP, TOK, TOTAL_LAYER

# Spike: modified z-score above 3.5 (Iglewicz & Hoaglin 1993; doctor/spike_rule.py, shared with the
# recorder's on-spike attribution); critical when also 10x the median live norm and z above 10 (tokengrad
# default: far past what gradient clipping at 1.0 absorbs in the shipped runs, whose largest spike is 6x
# the median).
SPIKE_WARNING_RATIO = 3.0  # tokengrad default: below 3x the median a z > 3.5 step is reported as info
SPIKE_CRITICAL_Z = 10.0
SPIKE_CRITICAL_RATIO = 10.0
SPIKE_MAX_FINDINGS = 5  # the largest spikes get a finding each
CULPRITS_K = 20
REPLAY_SAID = 5  # the one the message names
# Low-probability dominance (AR-Lopti, arXiv 2505.12929 Fig. 1: the few low-probability tokens dominate
# the gradient): the lowest bucket's median update share at least half, and at least 4x its token share.
LOW_SHARE = 0.5
LOW_RATIO = 4.0
# High-probability drag (arXiv 2505.12929 Sec. 3): the share of A > 0 tokens with p >= 0.75 whose log-prob
# rose over the step falls below one half: their update is dragged by the other tokens' gradients.
HIGH_LO = 0.75
HIGH_CORRECT = 0.5
HIGH_MIN_STEPS = 3
HIGH_ALPHA = 0.05  # sign test (more bucket steps below 0.5 than above): warning below it, info above
# A weighting rule that zeroes gradients: loss tokens with A != 0, not clipped, whose coef or weight is 0.
ZERO_WARNING = 0.05  # tokengrad default
ZERO_CRITICAL = 0.5

_LOPTI = "AR-Lopti, arXiv 2505.12929"


def grad_norm_series(view: RunView) -> pd.DataFrame:
    """[step, grad_norm]: the layers table's whole-model norm (max over updates), else the steps table's
    (the two tables name the columns alike)."""
    lay = view.layers
    if not lay.empty and (lay[LAYER.layer] == TOTAL_LAYER).any():
        total = lay[lay[LAYER.layer] == TOTAL_LAYER]
        tot = total.groupby(LAYER.step, as_index=False)[LAYER.grad_norm].max()
        if tot[LAYER.grad_norm].notna().any():
            return tot
    st = view.steps
    if st.empty or STEP.grad_norm not in st.columns:
        return pd.DataFrame(columns=[STEP.step, STEP.grad_norm])
    return st[[STEP.step, STEP.grad_norm]].dropna()


def spikes(gn: pd.DataFrame) -> pd.DataFrame:
    """[step, grad_norm, z, ratio] of the live steps whose robust z exceeds SPIKE_Z, largest first."""
    g = gn[STEP.grad_norm].to_numpy(dtype=float)
    live = np.isfinite(g) & (g > 0)
    if live.sum() < SPIKE_MIN_STEPS:
        return pd.DataFrame(columns=[STEP.step, STEP.grad_norm, "z", "ratio"])
    z = robust_z(g[live])
    out = gn[live].assign(z=z, ratio=g[live] / np.median(g[live]))
    return out[out["z"] > SPIKE_Z].sort_values(["z", STEP.step], ascending=[False, True])


@detector("gradient_spike", tables=("steps", "layers", "tokens"), page="inspector", per_event=True)
def gradient_spike(view: RunView) -> list[Finding]:
    """A live step's pre-clip gradient norm has robust z > 3.5 (critical: z > 10 and 10x the median), with
    the tokens behind it."""
    gn = grad_norm_series(view)
    live = int((np.isfinite(gn[STEP.grad_norm].to_numpy(dtype=float)) & (gn[STEP.grad_norm] > 0)).sum())
    if gn.empty:
        raise NotChecked("the run records no gradient norm (grad_norm)")
    if live < SPIKE_MIN_STEPS:
        raise NotChecked(f"{live} steps have a gradient, the robust z needs {SPIKE_MIN_STEPS}")
    found = spikes(gn)
    out = []
    for row in found.head(SPIKE_MAX_FINDINGS).itertuples():
        step = int(row.step)
        critical = row.z > SPIKE_CRITICAL_Z and row.ratio > SPIKE_CRITICAL_RATIO
        level = "critical" if critical else "warning" if row.ratio >= SPIKE_WARNING_RATIO else "info"
        tokens = lead_first(culprits(view, step, CULPRITS_K))
        who = summarize(tokens)
        replay = replayed_norms(view, step)
        msg = (
            f"step {step}: grad_norm {fmt(row.grad_norm)} = {fmt(row.ratio)}x the median live norm "
            f"(robust z {row.z:.1f})"
            + (f"; {who} of step {step}" if who else "")
            + _replay_clause(replay, row)
        )
        evidence = {
            "statistic": "modified z-score 0.6745 (x - median) / MAD over the live steps",
            "values": {
                "grad_norm": float(row.grad_norm),
                "z": float(row.z),
                "ratio_to_median": float(row.ratio),
                **{_replay_column(k): v for k, v in replay.items()},
            },
            "thresholds": {
                "z": SPIKE_Z,
                "critical_z": SPIKE_CRITICAL_Z,
                "critical_ratio": SPIKE_CRITICAL_RATIO,
            },
            "token_shares": share_note(tokens),
        }
        actions = (
            Action("inspect the culprit tokens; down-weight low-probability tokens (Lopti)", _LOPTI),
            *filter(None, [spike_action(view, step=step)]),  # what the rules would have done here
            Action("lower the learning rate or clip the gradient norm", "Pascanu et al., arXiv 1211.5063"),
        )
        conf = confidence_from_excess(float(row.z), SPIKE_Z)
        out.append(
            Finding(
                id="gradient_spike",
                severity=level,
                confidence=conf,
                first_step=step,
                last_step=step,
                message=msg,
                evidence=evidence,
                tokens=tokens,
                actions=actions,
                page="whatif" if has_rows_at(view, step) else "inspector",  # the rules at this step
            )
        )
    return out


def replayed_norms(view: RunView, step: int) -> dict[int, float]:
    """{k: the step's pre-clip gradient norm without its top-k culprit tokens} where the recorder replayed it
    (steps.grad_norm_without_top{k}, Attribution(on_spike=True): exact, by backward passes)."""
    st = view.steps
    cols = {k: _replay_column(k) for k in REPLAY_K if _replay_column(k) in st.columns}
    at = st[st[STEP.step] == step] if cols else st.iloc[:0]
    if at.empty:
        return {}
    values = {k: pd.to_numeric(at[c], errors="coerce").iloc[0] for k, c in cols.items()}  # null in older runs
    return {k: float(v) for k, v in values.items() if np.isfinite(v)}


def _replay_column(k: int) -> str:
    """steps.grad_norm_without_top{k}, through the schema (AttributeError for a k it does not record)."""
    return getattr(STEP, f"grad_norm_without_top{k}")


def _replay_clause(replay: dict[int, float], row) -> str:
    if REPLAY_SAID not in replay:
        return ""
    others = ", ".join(f"top {k}: {fmt(v)}" for k, v in replay.items() if k != REPLAY_SAID)
    return (
        f"; without its top {REPLAY_SAID} culprit tokens the step's gradient norm is "
        f"{fmt(replay[REPLAY_SAID])}, not {fmt(row.grad_norm)} (exact replay"
        + (f"; {others})" if others else ")")
    )


def _bucket_rows(view: RunView) -> pd.DataFrame:
    """The analysed buckets with tokens; NotChecked when the run has no bucket-analysis step."""
    b = view.buckets
    if not b.empty:
        b = b[(b[BUCKET.bucket] != RESIDUAL_BUCKET) & b[BUCKET.lo].notna() & (b[BUCKET.n_tokens] > 0)]
    if b.empty:
        raise NotChecked("the run has no bucket-analysis steps (buckets table; bucket_every)")
    return b


@detector("low_prob_dominance", tables=("buckets",), page="buckets")
def low_prob_dominance(view: RunView) -> list[Finding]:
    """The p < 0.25 tokens make >= 0.5 of the update and >= 4x their share of the loss tokens, by the one
    definition the dashboard, export and docs quote (tokengrad.read.headline: pooled over the analysed
    updates, each counted by its squared size; exact), with the trend of the lowest bucket's share."""
    b = _bucket_rows(view)
    if b[BUCKET.update_share].isna().all():
        raise NotChecked("no bucket-analysis step records update_share")
    low = b[b[BUCKET.lo] == b[BUCKET.lo].min()].dropna(subset=[BUCKET.update_share, BUCKET.token_share])
    low = low[low[BUCKET.token_share] > 0]
    if len(low) < 2:
        raise NotChecked(f"{len(low)} bucket-analysis step(s) hold low-probability tokens, the trend needs 2")
    h = low_prob_shares(view.run, None if view.upto is None else (int(b[BUCKET.step].min()), view.upto))
    share, tok = h.update_share, h.token_share
    if not (np.isfinite(share) and tok > 0):
        raise NotChecked("the analysed updates give no pooled low-probability share")
    ratio = share / tok
    if share < LOW_SHARE or ratio < LOW_RATIO:
        return []
    tr = trend(low[BUCKET.update_share].to_numpy(), low[BUCKET.step].to_numpy())
    direction = "rising" if tr.rising(TREND_ALPHA) else "falling" if tr.falling(TREND_ALPHA) else "flat"
    msg = (
        f"tokens with {low_prob_label(h.below)} are {pct(tok)} of the loss tokens but make {pct(share)} of "
        f"the update ({fmt(ratio)}x; {UPDATE_SHARE_NAME} pooled over {h.n_updates} analysed updates, "
        f"exact, as the dashboard shows it), trend {direction} (Mann-Kendall p {tr.p_value:.2g})"
    )
    evidence = {
        "statistic": "tokengrad.read.headline.low_prob_shares: " + DEFINITION,
        "values": {
            "update_share": share,
            "token_share": tok,
            "ratio": ratio,
            "below": h.below,
            **tr.as_dict(),
        },
        "thresholds": {"share": LOW_SHARE, "ratio": LOW_RATIO},
        "exact": True,
    }
    last = int(low[BUCKET.step].max())
    tokens = tuple(
        t for t in culprits(view, last, CULPRITS_K) if t.prob is not None and t.prob < low[BUCKET.hi].iloc[0]
    )
    actions = (
        Action("separate the low-probability tokens' update (Lopti) or reweight them", _LOPTI),
        *filter(None, [dominance_action(view)]),  # what the rules would have made of these steps
        Action("compare with up-weighting them (Lp-Reg), the opposite prescription", "arXiv 2510.03222"),
    )
    return [
        Finding(
            id="low_prob_dominance",
            severity="warning",
            confidence=confidence_from_excess(ratio, LOW_RATIO),
            first_step=int(low[BUCKET.step].min()),
            last_step=last,
            message=msg,
            evidence=evidence,
            tokens=tokens[:5],
            actions=actions,
        )
    ]


@detector("high_prob_drag", tables=("buckets",), page="buckets")
def high_prob_drag(view: RunView) -> list[Finding]:
    """The p >= 0.75 bucket's correct ratio (A > 0 tokens whose log-prob rose) has median below 0.5."""
    b = _bucket_rows(view)
    high = b[b[BUCKET.lo] >= HIGH_LO - 1e-6].dropna(subset=[BUCKET.correct_ratio])
    per = high.groupby(BUCKET.step)[BUCKET.correct_ratio].mean()  # several high buckets (deciles): their mean
    if len(per) < HIGH_MIN_STEPS:
        raise NotChecked(
            f"{len(per)} bucket-analysis step(s) record the p >= {HIGH_LO} correct_ratio, the sign test "
            f"needs {HIGH_MIN_STEPS}"
        )
    median = float(per.median())
    if median >= HIGH_CORRECT:
        return []
    below = int((per < HIGH_CORRECT).sum())
    p = sign_test_greater(below, len(per))
    msg = (
        f"of the A > 0 tokens with p >= {HIGH_LO}, a median {pct(median)} rose over the step (below "
        f"{pct(HIGH_CORRECT)} at {below} of {len(per)} bucket steps; exact): the rest of the update pulls "
        f"confident correct tokens down"
    )
    evidence = {
        "statistic": "median over bucket steps of correct_ratio of buckets with lo >= 0.75; sign test",
        "values": {"median": median, "below": below, "steps": len(per), "sign_test_p": p},
        "thresholds": {
            "lo": HIGH_LO,
            "correct_ratio": HIGH_CORRECT,
            "min_steps": HIGH_MIN_STEPS,
            "alpha": HIGH_ALPHA,
        },
        "exact": True,
    }
    actions = (Action("update low- and high-probability tokens separately (Lopti)", _LOPTI),)
    first = int(per.index[np.argmax(per.to_numpy() < HIGH_CORRECT)])
    level = "warning" if p < HIGH_ALPHA else "info"
    return [
        Finding(
            id="high_prob_drag",
            severity=level,
            confidence=1.0 - p,
            first_step=first,
            last_step=int(per.index.max()),
            message=msg,
            evidence=evidence,
            actions=actions,
        )
    ]


def _need_token_values(view: RunView, *cols: str) -> None:
    """NotChecked naming the first of `cols` that the tokens table lacks or no token row records."""
    if not view.has_tokens:
        raise NotChecked("the run has no token rows")
    missing = [c for c in cols if not view.has_token_columns(c)]
    if missing:
        raise NotChecked(f"the tokens table has no {missing[0]}")
    counts = view.sql("SELECT " + ", ".join(f"count({c}) AS {c}" for c in cols) + " FROM tokens")
    empty = [c for c in cols if not counts[c].iloc[0]]
    if empty:
        raise NotChecked(f"no token row records {empty[0]}")


@detector("zeroed_gradients", tables=("tokens",), page="inspector")
def zeroed_gradients(view: RunView) -> list[Finding]:
    """Over 5 % (critical: 50 %) of the unclipped, unmasked A != 0 loss tokens get coef or weight 0: a
    weighting rule silently removes their gradient. Tokens a host's mask removed (tokens.masked: an IS or
    rollout-correction mask, with its reason in masked_by) are the masked_sequences detector's, not this
    one's."""
    _need_token_values(view, TOK.coef, TOK.weight, TOK.advantage)
    if not view.has_token_columns(TOK.clipped):
        raise NotChecked(f"the tokens table has no {TOK.clipped}")
    unmasked = f" AND NOT coalesce({TOK.masked}, false)" if view.has_token_columns(TOK.masked) else ""
    zeroed = f"{TOK.coef} = 0 OR {TOK.weight} = 0"
    # any zeroed token at all? (two columns read; a healthy run, with none, ends here)
    if not view.sql(f"SELECT count(*) AS n FROM tokens WHERE {zeroed}")["n"].iloc[0]:
        return []
    per = view.sql(
        f"SELECT {TOK.step}, count(*) AS n, count(*) FILTER (WHERE {zeroed}) AS zero, "
        f"max({TOK.prob}) FILTER (WHERE {zeroed}) AS p_max, "
        f"min({TOK.prob}) FILTER (WHERE {zeroed}) AS p_min FROM tokens "
        f"WHERE {TOK.in_loss} AND {TOK.advantage} != 0 AND NOT coalesce({TOK.clipped}, false){unmasked} "
        f"GROUP BY {TOK.step} ORDER BY {TOK.step}"
    )
    if per.empty or per["zero"].sum() == 0:
        return []
    share = float(per["zero"].sum() / per["n"].sum())
    if share < ZERO_WARNING:
        return []
    hit = per[per["zero"] > 0]
    first, last = int(hit[TOK.step].min()), int(hit[TOK.step].max())
    p_lo, p_hi = float(hit["p_min"].min()), float(hit["p_max"].max())
    rule = (view.meta.get("weighting") or {}).get("name", "?")
    msg = (
        f"{pct(share)} of the unclipped A != 0 loss tokens got no gradient (coef or weight 0) under rule "
        f"{rule!r}, steps {first}-{last}, at p in [{fmt(p_lo)}, {fmt(p_hi)}] (exact: autograd coef)"
    )
    evidence = {
        "statistic": "share of in_loss, A != 0, unclipped, unmasked tokens with coef == 0 or weight == 0",
        "values": {"share": share, "tokens": int(per["zero"].sum()), "p_min": p_lo, "p_max": p_hi},
        "thresholds": {"warning": ZERO_WARNING, "critical": ZERO_CRITICAL},
        "exact": True,
    }
    actions = (
        Action(
            "check the rule's weight curve and its placement (TR-GRPO ratio vs loss placement)",
            "arXiv 2509.21207",
        ),
    )
    level = "critical" if share >= ZERO_CRITICAL else "warning"
    conf = confidence_from_excess(share, ZERO_WARNING)
    return [
        Finding(
            id="zeroed_gradients",
            severity=level,
            confidence=conf,
            first_step=first,
            last_step=last,
            message=msg,
            evidence=evidence,
            actions=actions,
        )
    ]
