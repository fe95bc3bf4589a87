"""Detectors on the samples table: advantage collapse (all-correct vs all-wrong groups) and degenerate
groups (what the completions say, length hacking to format gaming: tokengrad.doctor.detect_outputs)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.doctor.finding import Action, Finding, NotChecked, TokenEvidence
from tokengrad.doctor.registry import detector, pct
from tokengrad.doctor.stats import sustained
from tokengrad.doctor.view import RunView
from tokengrad.schema import SAMPLE, SAMPLE_EXTRA

# Advantage collapse: share of a step's groups whose rewards are all equal (zero advantage, GRPO arXiv
# 2402.03300 Eq. 3); DAPO (arXiv 2503.14476 Sec. 3.2) reports the all-correct share growing during training.
COLLAPSE_WARNING = 0.6  # tokengrad default
COLLAPSE_CRITICAL = 0.9
COLLAPSE_SUSTAIN = 5
# Degenerate groups: every completion of the group is the same text (no exploration left).
DEGENERATE_WARNING = 0.5  # tokengrad default
DEGENERATE_SUSTAIN = 5


def _per_step_share(flags: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    per = flags.groupby(SAMPLE.step)[column].mean()
    return per.index.to_numpy().astype(int), per.to_numpy(dtype=float)


def _groups(view: RunView) -> pd.DataFrame:
    s = view.samples
    if s.empty:
        raise NotChecked("the run records no samples (rewards per completion)")
    if s[SAMPLE.reward].isna().all():
        raise NotChecked("no completion has a reward (every recorded reward is NaN)")
    correct = SAMPLE_EXTRA.correct
    s = s.assign(correct_=s[correct] if correct in s.columns else np.nan)
    top, bottom = float(s[SAMPLE.reward].max()), float(s[SAMPLE.reward].min())
    g = s.groupby([SAMPLE.step, SAMPLE.group_id]).agg(
        n=(SAMPLE.reward, "size"),
        lo=(SAMPLE.reward, "min"),
        hi=(SAMPLE.reward, "max"),
        c=("correct_", "mean"),
    )
    g = g[g["n"] >= 2].reset_index()
    g["zero"] = g["lo"] == g["hi"]
    has_correct = g["c"].notna()
    g["all_correct"] = g["zero"] & np.where(has_correct, g["c"] == 1, g["hi"] == top)
    g["all_wrong"] = g["zero"] & np.where(has_correct, g["c"] == 0, g["lo"] == bottom)
    return g


@detector("advantage_collapse", tables=("samples",), page="inspector")
def advantage_collapse(view: RunView) -> list[Finding]:
    """Over 60 % of a step's groups (critical: 90 %) have one reward, 5 steps; all-correct vs all-wrong."""
    g = _groups(view)
    if g.empty:
        raise NotChecked("no group holds two scored completions (samples.group_id)")
    steps, share = _per_step_share(g, "zero")
    for level, threshold in (("critical", COLLAPSE_CRITICAL), ("warning", COLLAPSE_WARNING)):
        run = sustained(share > threshold, COLLAPSE_SUSTAIN)
        if run is None:
            continue
        a, b = run
        span = g[g[SAMPLE.step].between(steps[a], steps[b - 1])]
        n_zero = int(span["zero"].sum())
        ac, aw = int(span["all_correct"].sum()), int(span["all_wrong"].sum())
        msg = (
            f"{pct(float(share[a:b].mean()))} of the groups had one reward over steps "
            f"{steps[a]}-{steps[b - 1]} (zero advantage): {ac} all-correct, {aw} all-wrong, "
            f"{n_zero - ac - aw} other of {n_zero}"
        )
        evidence = {
            "statistic": f"share of groups with equal rewards per step, {COLLAPSE_SUSTAIN} steps in a row",
            "values": {"mean_share": float(share[a:b].mean()), "all_correct": ac, "all_wrong": aw},
            "thresholds": {
                "warning": COLLAPSE_WARNING,
                "critical": COLLAPSE_CRITICAL,
                "sustain": COLLAPSE_SUSTAIN,
            },
        }
        kind = "too easy: all-correct" if ac >= aw else "too hard: all-wrong"
        actions = (
            Action(f"the prompts are {kind}; filter or re-balance the task's difficulty", "arXiv 2503.14476"),
            Action(
                "dynamic sampling refills the batch with informative groups",
                "DAPO, arXiv 2503.14476 Sec. 3.2",
            ),
        )
        tokens = _group_samples(view, span[span["zero"]])
        conf = min(0.99, 0.5 + 0.05 * (b - a))
        return [
            Finding(
                id="advantage_collapse",
                severity=level,
                confidence=conf,
                first_step=steps[a],
                last_step=steps[b - 1],
                message=msg,
                evidence=evidence,
                tokens=tokens,
                actions=actions,
            )
        ]
    return []


def _group_samples(view: RunView, groups: pd.DataFrame, k: int = 3) -> tuple[TokenEvidence, ...]:
    """One sample of each of the first k groups: where the dashboard can show them."""
    s = view.samples
    out = []
    for row in groups.head(k).itertuples():
        hit = s[(s[SAMPLE.step] == row.step) & (s[SAMPLE.group_id] == row.group_id)].head(1)
        for r in hit.itertuples():
            out.append(
                TokenEvidence(
                    step=int(r.step),
                    sample_id=int(r.sample_id),
                    text=str(r.completion)[:80],
                    share=None,
                    share_of="count",
                )
            )
    return tuple(out)


@detector("degenerate_groups", tables=("samples",), page="inspector")
def degenerate_groups(view: RunView) -> list[Finding]:
    """Over half of a step's groups answer with one identical completion, 5 steps in a row."""
    s = view.samples
    if s.empty:
        raise NotChecked("the run records no samples (completions)")
    if s[SAMPLE.completion].isna().all():
        raise NotChecked("no sample records its completion text")
    g = s.groupby([SAMPLE.step, SAMPLE.group_id]).agg(
        n=(SAMPLE.completion, "size"), u=(SAMPLE.completion, "nunique")
    )
    g = g[g["n"] >= 2].reset_index()
    if g.empty:
        raise NotChecked("no group holds two completions (samples.group_id)")
    g["same"] = g["u"] == 1
    steps, share = _per_step_share(g, "same")
    run = sustained(share > DEGENERATE_WARNING, DEGENERATE_SUSTAIN)
    if run is None:
        return []
    a, b = run
    span_txt = f"{steps[a]}-{steps[b - 1]}"
    msg = f"{pct(float(share[a:b].mean()))} of the groups repeat one completion over steps {span_txt}"
    evidence = {
        "statistic": "share of groups with a single distinct completion text, sustained",
        "values": {"mean_share": float(share[a:b].mean())},
        "thresholds": {"warning": DEGENERATE_WARNING, "sustain": DEGENERATE_SUSTAIN},
    }
    span = g[g[SAMPLE.step].between(steps[a], steps[b - 1]) & g["same"]]
    actions = (Action("raise the sampling temperature or the group size", "arXiv 2402.03300 Sec. 4"),)
    return [
        Finding(
            id="degenerate_groups",
            severity="warning",
            confidence=min(0.99, 0.5 + 0.05 * (b - a)),
            first_step=steps[a],
            last_step=steps[b - 1],
            message=msg,
            evidence=evidence,
            tokens=_group_samples(view, span),
            actions=actions,
        )
    ]
