"""Detectors of a run's health on the steps table and the rank status: reward-std death, non-finite values,
gradient-norm drift, throughput decay, dead-step streaks, dropped rows. Defaults: the constants below, with
their sources (docs/doctor.md lists them all)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tokengrad.doctor.finding import Action, Finding, NotChecked
from tokengrad.doctor.registry import detector, fmt, pct, window_medians
from tokengrad.doctor.stats import confidence_from_p, longest_run, trend
from tokengrad.doctor.thresholds import TREND_ALPHA
from tokengrad.doctor.view import RunView
from tokengrad.schema import STEP

# Reward std of the batch: no learning signal left (GRPO, arXiv 2402.03300 Eq. 3: A = (r - mean) / std).
REWARD_STD_FLOOR = 0.01
REWARD_STD_SUSTAIN = 5
REWARD_STD_CRITICAL_SUSTAIN = 20
# Dead steps (grad_norm exactly 0: every advantage 0): DAPO (arXiv 2503.14476 Sec. 3.2) filters such
# groups with dynamic sampling.
DEAD_STREAK_WARNING = 5
DEAD_STREAK_CRITICAL = 20
# Gradient-norm drift: the end-window median this many times the start-window median, rising.
GRAD_DRIFT_RATIO = 10.0
# Throughput decay: the end-window median step time this many times the start window's, rising.
THROUGHPUT_RATIO = 1.5

_DAPO_DS = Action(
    "use dynamic sampling (drop groups with one reward, refill the batch)", "DAPO, arXiv 2503.14476 Sec. 3.2"
)


def _streak(mask: np.ndarray, warn: int, crit: int) -> tuple[int, int, str] | None:
    """The longest run of True values as (start, stop, severity) if it is at least `warn` long."""
    run = longest_run(mask)
    if run is None or run[1] - run[0] < warn:
        return None
    return run[0], run[1], "critical" if run[1] - run[0] >= crit else "warning"


@detector("reward_std_death", tables=("steps",))
def reward_std_death(view: RunView) -> list[Finding]:
    """The batch reward std stays below 0.01 for 5 steps (critical: 20): no learning signal."""
    steps, x = view.need(STEP.reward_std, "batch reward std")
    found = _streak(x < REWARD_STD_FLOOR, REWARD_STD_SUSTAIN, REWARD_STD_CRITICAL_SUSTAIN)
    if found is None:
        return []
    a, b, level = found
    msg = (
        f"reward_std below {REWARD_STD_FLOOR} for {b - a} steps in a row (steps {int(steps[a])}-"
        f"{int(steps[b - 1])}, max {fmt(float(x[a:b].max()))}): the rewards carry no signal"
    )
    evidence = {
        "statistic": "longest run of steps with reward_std below the floor",
        "values": {"streak": b - a, "max_in_streak": float(x[a:b].max())},
        "thresholds": {
            "floor": REWARD_STD_FLOOR,
            "sustain": REWARD_STD_SUSTAIN,
            "critical_sustain": REWARD_STD_CRITICAL_SUSTAIN,
        },
    }
    actions = (
        _DAPO_DS,
        Action("make the task harder or easier so groups disagree", "arXiv 2402.03300 Eq. 3"),
    )
    conf = min(0.99, 0.5 + 0.025 * (b - a))
    return [
        Finding(
            id="reward_std_death",
            severity=level,
            confidence=conf,
            first_step=int(steps[a]),
            last_step=int(steps[b - 1]),
            message=msg,
            evidence=evidence,
            actions=actions,
        )
    ]


def _nonfinite_steps(view: RunView, col: str) -> set[int]:
    """Steps whose `col` is NaN or inf on some rank. Asked of DuckDB, which keeps a NaN apart from a null
    (a step that did not log the value): pandas reads both as NaN, so a NaN loss looked unlogged there.
    `NOT isfinite`, not `isnan`: DuckDB 2.0.1's isnan is false on some NaNs written from numpy (seen on a
    NaN reward), while isfinite is false on every NaN and inf and null on null."""
    query = f"SELECT DISTINCT {STEP.step} FROM steps WHERE NOT isfinite({col}){view.step_cut('AND')}"
    return set(view.sql(query)[STEP.step].astype(int).tolist())


@detector("nonfinite", tables=("steps",))
def nonfinite(view: RunView) -> list[Finding]:
    """A NaN or inf in the loss, the gradient norm or the recorded token tensors (critical). Under fp16
    gradient scaling an overflowing update is skipped by the scaler, which lowers its scale and goes on:
    those steps (non-finite gradient norm, finite loss, `loss_scale` recorded) are told apart, info while
    the run recovers and critical when the scaler skips every recent update."""
    df = view.steps
    if df.empty:
        raise NotChecked("the run has no committed steps")
    if not {STEP.loss, STEP.grad_norm, STEP.n_nonfinite} & set(df.columns):
        raise NotChecked("the run records no loss, grad_norm or n_nonfinite")
    hits = {col: _nonfinite_steps(view, col) for col in (STEP.loss, STEP.grad_norm) if col in df.columns}
    skipped = _scaler_skipped(df, hits)
    bad = set().union(*hits.values()) - skipped
    parts = {col: len(hit - skipped) for col, hit in hits.items()}
    if STEP.n_nonfinite in df.columns:
        hit = df[STEP.n_nonfinite].fillna(0).to_numpy(dtype=float) > 0
        parts["n_nonfinite_steps"] = int(hit.sum())
        bad |= set(df[STEP.step].to_numpy()[hit].astype(int).tolist())
    if bad:
        return [_nonfinite_finding(bad, {**parts, "scaler_skipped": len(skipped)})]
    return [_scaler_finding(df, skipped)] if skipped else []


def _scaler_skipped(df, hits: dict[str, set[int]]) -> set[int]:
    """Steps an fp16 gradient scaler skipped: a loss scale recorded, the gradient norm non-finite, the loss
    finite (a non-finite loss is the model's, at any scale)."""
    if STEP.loss_scale not in df.columns or STEP.grad_norm not in hits:
        return set()
    scaled = set(df.loc[df[STEP.loss_scale].notna(), STEP.step].astype(int).tolist())
    return (hits[STEP.grad_norm] & scaled) - hits.get(STEP.loss, set())


def _nonfinite_finding(bad: set[int], parts: dict) -> Finding:
    steps = np.array(sorted(bad), dtype=int)
    msg = f"non-finite values at {steps.size} step(s) from step {steps[0]}: " + ", ".join(
        f"{k} {v}" for k, v in parts.items() if v
    )
    evidence = {"statistic": "count of NaN/inf", "values": {**parts, "steps": steps[:20].tolist()}}
    actions = (
        Action(
            "lower the learning rate; clip gradients; check log-probs of p = 0 tokens", "arXiv 2505.12929"
        ),
        Action("record with Output(on_error='raise') to stop at the first bad step", "docs/api.md"),
    )
    return Finding(
        id="nonfinite",
        severity="critical",
        confidence=1.0,
        first_step=steps[0],
        last_step=steps[-1],
        message=msg,
        evidence=evidence,
        actions=actions,
    )


SCALER_STUCK = 5  # this many last steps all skipped: the gradient overflows at every scale the scaler tries


def _scaler_finding(df, skipped: set[int]) -> Finding:
    steps = np.array(sorted(skipped), dtype=int)
    last = df[STEP.step].astype(int).sort_values().to_numpy()[-SCALER_STUCK:]
    stuck = len(last) == SCALER_STUCK and set(last.tolist()) <= skipped
    lowest = float(df.loc[df[STEP.step].isin(steps), STEP.loss_scale].min())
    msg = (
        f"the fp16 gradient scaler skipped {steps.size} of {len(df)} step(s) for a non-finite gradient "
        f"(from step {steps[0]}, loss scale down to {lowest:g})"
    )
    msg += (
        f": the last {SCALER_STUCK} steps all skipped, no update is being applied"
        if stuck
        else "; it lowers its scale and goes on"
    )
    action = (
        "train in bf16, or find the NaN in the forward (log of p = 0 tokens)"
        if stuck
        else "nothing: early overflows while the scaler calibrates are expected"
    )
    return Finding(
        id="nonfinite",
        severity="critical" if stuck else "info",
        confidence=1.0,
        first_step=steps[0],
        last_step=steps[-1],
        message=msg,
        evidence={
            "statistic": "steps skipped by the gradient scaler",
            "values": {
                "scaler_skipped": int(steps.size),
                "steps": steps[:20].tolist(),
                "loss_scale_min": lowest,
            },
        },
        actions=(Action(action, "docs/api.md"),),
    )


def _growth(name, steps, x, *, ratio, what, unit, actions, transform=None) -> list[Finding]:
    """A finding when the end-window median of x is `ratio` times the start window's and x rises
    (Mann-Kendall on transform(x), Theil-Sen slope); onset: the first step past ratio x the start."""
    start, end, _ = window_medians(x)
    tr = trend(x if transform is None else transform(x), steps)
    if start <= 0 or end < ratio * start or not tr.rising(TREND_ALPHA):
        return []
    msg = (
        f"{what} rose from {fmt(start)}{unit} to {fmt(end)}{unit} ({fmt(end / start)}x, window medians); "
        f"Mann-Kendall tau {tr.tau:.2f}, p {tr.p_value:.1e}"
    )
    evidence = {
        "statistic": f"end/start window medians of {what}; Mann-Kendall trend, Theil-Sen slope",
        "values": {"start": start, "end": end, **tr.as_dict()},
        "thresholds": {"ratio": ratio, "alpha": TREND_ALPHA},
    }
    first = int(steps[np.argmax(x > ratio * start)])
    conf = confidence_from_p(tr.p_value)
    return [
        Finding(
            id=name,
            severity="warning",
            confidence=conf,
            first_step=first,
            last_step=int(steps[-1]),
            message=msg,
            evidence=evidence,
            actions=actions,
        )
    ]


@detector("grad_norm_drift", tables=("steps",))
def grad_norm_drift(view: RunView) -> list[Finding]:
    """The live steps' gradient norm grows tenfold over the run (Mann-Kendall on its log, rising)."""
    col = view.need(STEP.grad_norm, "gradient norm")
    live = np.isfinite(col[1]) & (col[1] > 0)
    if live.sum() < 10:
        raise NotChecked(f"{int(live.sum())} steps have a gradient, the trend needs 10")
    actions = (
        Action("lower the learning rate; check the weighting rule's largest weights", "arXiv 2505.12929"),
    )
    return _growth(
        "grad_norm_drift",
        col[0][live],
        col[1][live],
        ratio=GRAD_DRIFT_RATIO,
        what="live grad_norm",
        unit="",
        actions=actions,
        transform=np.log,
    )


# Step time follows the machine's load as much as the run: on the shared 2-core machine that recorded the
# shipped sample runs, lab_kk_grpo's end-window median step time was 3.14x its start window's (8.2 -> 25.8 s,
# above 1.5x for 72 of its 99 steps) while the two K&K runs recorded beside it got faster (0.78x, 0.90x):
# load, not the run. A rise is `info` unless it is twice what load alone gave: THROUGHPUT_WARNING_RATIO.
THROUGHPUT_LOAD_RATIO = 3.14
THROUGHPUT_WARNING_RATIO = 2 * THROUGHPUT_LOAD_RATIO


@detector("throughput_decay", tables=("steps",), about="machine")
def throughput_decay(view: RunView) -> list[Finding]:
    """Step wall time grows by half over the run (Mann-Kendall rising; the first step, warm-up, left out):
    info; a warning from 6.28x, twice the 3.14x that machine load alone gave a shipped run."""
    col = view.column(STEP.time_step)
    if col is None:
        raise NotChecked("the run records no step time (time_step)")
    if col[1].size < 11:
        raise NotChecked(f"{col[1].size} steps record their time, the trend needs 11 (the first left out)")
    actions = (
        Action("check completion lengths, memory growth and the recorder's time_record", "docs/scale.md"),
        Action("compare with what else ran on the machine: step time follows its load", "docs/doctor.md"),
    )
    found = _growth(
        "throughput_decay",
        col[0][1:],
        col[1][1:],
        ratio=THROUGHPUT_RATIO,
        what=STEP.time_step,
        unit=" s",
        actions=actions,
    )
    return [_load_severity(f) for f in found]


def _load_severity(f: Finding) -> Finding:
    """`warning` only when the end/start ratio is far beyond load noise, else `info`, said in the message."""
    ratio = f.evidence["values"]["end"] / f.evidence["values"]["start"]
    evidence = {
        **f.evidence,
        "thresholds": {**f.evidence["thresholds"], "warning_ratio": THROUGHPUT_WARNING_RATIO},
    }
    far = ratio >= THROUGHPUT_WARNING_RATIO
    load = f"machine load alone gave {fmt(THROUGHPUT_LOAD_RATIO)}x on a shipped run"
    msg = f"{f.message}; {load}" + (
        "" if far else f", so below {fmt(THROUGHPUT_WARNING_RATIO)}x this is info"
    )
    return replace(f, severity="warning" if far else "info", message=msg, evidence=evidence)


@detector("dead_steps", tables=("steps",))
def dead_steps(view: RunView) -> list[Finding]:
    """A streak of 5 steps (critical: 20) whose gradient is exactly 0 (every advantage 0)."""
    steps, g = view.need(STEP.grad_norm, "gradient norm")
    dead = g == 0
    found = _streak(dead, DEAD_STREAK_WARNING, DEAD_STREAK_CRITICAL)
    if found is None:
        return []
    a, b, level = found
    msg = (
        f"{b - a} steps in a row without a gradient (steps {int(steps[a])}-{int(steps[b - 1])}); "
        f"{int(dead.sum())} of {dead.size} steps dead ({pct(dead.mean())})"
    )
    evidence = {
        "statistic": "longest run of steps with grad_norm == 0",
        "values": {"streak": b - a, "dead": int(dead.sum()), "steps": int(dead.size)},
        "thresholds": {"warning": DEAD_STREAK_WARNING, "critical": DEAD_STREAK_CRITICAL},
    }
    conf = min(0.99, 0.5 + 0.025 * (b - a))
    return [
        Finding(
            id="dead_steps",
            severity=level,
            confidence=conf,
            first_step=int(steps[a]),
            last_step=int(steps[b - 1]),
            message=msg,
            evidence=evidence,
            actions=(_DAPO_DS,),
        )
    ]


@detector("rows_dropped", tables=("ranks",))
def rows_dropped(view: RunView) -> list[Finding]:
    """The recorder dropped rows (a writer failure under Output(on_error='count')): the run is incomplete."""
    status = view.run.rank_status
    counts: dict[str, int] = {}
    sources = [s.get("rows_dropped") for s in status] or [view.meta.get("rows_dropped")]
    for src in sources:
        for table, n in (src or {}).items() if isinstance(src, dict) else ():
            if isinstance(n, int) and n > 0:
                counts[table] = counts.get(table, 0) + n
    if not counts:
        return []
    msg = "the recorder dropped " + ", ".join(f"{n} {t} rows" for t, n in sorted(counts.items()))
    evidence = {"statistic": "rows_dropped of the rank status files", "values": counts}
    actions = (
        Action("check disk space and the writer warnings; record with on_error='raise'", "docs/api.md"),
    )
    return [
        Finding(
            id="rows_dropped",
            severity="warning",
            confidence=1.0,
            first_step=None,
            last_step=None,
            message=msg,
            evidence=evidence,
            actions=actions,
        )
    ]
