"""Reward integrity: the recorded rewards themselves are wrong, not the training. A reward function that
returns NaN or None (a timeout, a parse error) makes its group's advantages NaN or is silently turned into a
penalty; one that never varies gives no group a learning signal (GRPO's advantage is reward minus the group
mean, arXiv 2402.03300). A run without rewards is reported as "not checked" (NotChecked), never as healthy."""

from __future__ import annotations

import pandas as pd

from tokengrad.doctor.finding import Action, Finding, NotChecked, TokenEvidence
from tokengrad.doctor.registry import detector, fmt
from tokengrad.doctor.view import RunView
from tokengrad.schema import SAMPLE, STEP

CONST_REWARD_STEPS = 10
CONST_REWARD_GROUPS = 20


def _need_rewards(view: RunView) -> None:
    if view.samples.empty:
        raise NotChecked("the run has no samples table")
    if view.sql(f"SELECT count({SAMPLE.reward}) AS n FROM samples{view.step_cut()}")["n"].iloc[0] == 0:
        raise NotChecked("no sample holds a reward")


@detector("reward_nonfinite", page="inspector", tables=("samples",), about="data")
def reward_nonfinite(view: RunView) -> list[Finding]:
    """A NaN, inf or missing reward among the recorded ones (critical): the advantages of its group are
    NaN or silently computed without it."""
    _need_rewards(view)
    reward = SAMPLE.reward
    bad = view.sql(
        f"SELECT {SAMPLE.step}, {SAMPLE.sample_id}, {SAMPLE.group_id}, {reward} IS NULL AS missing "
        f"FROM samples WHERE ({reward} IS NULL OR NOT isfinite({reward})){view.step_cut('AND')} "
        f"ORDER BY {SAMPLE.step}, {SAMPLE.sample_id}"
    )
    if bad.empty:
        return []
    missing = int(bad["missing"].sum())
    first = bad.iloc[0]
    msg = (
        f"{len(bad)} reward(s) are NaN, inf or missing ({missing} missing) over "
        f"{bad[STEP.step].nunique()} step(s), first step {int(first[STEP.step])} sample "
        f"{int(first[SAMPLE.sample_id])}"
    )
    evidence = {
        "statistic": "samples whose reward is NaN, inf or null while others hold one",
        "values": {
            "samples": len(bad),
            "missing": missing,
            "steps": sorted({int(s) for s in bad[STEP.step]})[:20],
        },
    }
    actions = (Action("check the reward function's failure path (a timeout, a parse error)", "docs/api.md"),)
    first_step, last_step = int(bad[STEP.step].min()), int(bad[STEP.step].max())
    return [
        Finding(
            id="reward_nonfinite",
            severity="critical",
            confidence=1.0,
            first_step=first_step,
            last_step=last_step,
            message=msg,
            evidence=evidence,
            tokens=TokenEvidence.from_rows(bad),
            actions=actions,
        )
    ]


@detector("reward_constant", tables=("samples",), about="data")
def reward_constant(view: RunView) -> list[Finding]:
    """A task's reward is one value over every group of the run (at least 10 steps and 20 groups): a reward
    function that returns a constant, or a task the policy never (or always) solves."""
    _need_rewards(view)
    df = view.samples.dropna(subset=[SAMPLE.reward])
    if (n := df[STEP.step].nunique()) < CONST_REWARD_STEPS:
        raise NotChecked(f"{n} steps record rewards, the check needs {CONST_REWARD_STEPS}")
    task = df[SAMPLE.task].fillna("") if SAMPLE.task in df.columns else pd.Series("", index=df.index)
    out = []
    for name, part in df.groupby(task, sort=True):
        steps = part[STEP.step].nunique()
        groups = part.groupby([STEP.step, SAMPLE.group_id]).ngroups
        if part[SAMPLE.reward].nunique() != 1 or steps < CONST_REWARD_STEPS or groups < CONST_REWARD_GROUPS:
            continue
        value = float(part[SAMPLE.reward].iloc[0])
        label = f"task {name!r}" if name else "the run"
        msg = (
            f"every reward of {label} is {fmt(value)}: {len(part)} samples in {groups} groups over {steps} "
            "steps; no group carries a learning signal (a constant reward function, or a task never or "
            "always solved)"
        )
        evidence = {
            "statistic": "distinct rewards per task over the run",
            "values": {"task": name, "reward": value, "samples": len(part), "groups": groups, "steps": steps},
            "thresholds": {"steps": CONST_REWARD_STEPS, "groups": CONST_REWARD_GROUPS},
        }
        actions = (Action("call the reward function on a known-good and a known-bad answer", "docs/api.md"),)
        first, last = int(part[STEP.step].min()), int(part[STEP.step].max())
        rows = part.drop_duplicates(STEP.step)
        out.append(
            Finding(
                id="reward_constant",
                severity="warning",
                confidence=1.0,
                first_step=first,
                last_step=last,
                message=msg,
                evidence=evidence,
                tokens=TokenEvidence.from_rows(rows),
                actions=actions,
            )
        )
    return out
