"""Detectors on what the policy writes: length reward hacking, truncation at max_new_tokens, repetition,
format gaming. Defaults: the constants below, with their sources."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.doctor.finding import Action, Finding, NotChecked, TokenEvidence
from tokengrad.doctor.registry import detector, fmt, pct, window_medians
from tokengrad.doctor.stats import confidence_from_p, spearman, sustained, trend
from tokengrad.doctor.thresholds import TREND_ALPHA
from tokengrad.doctor.view import RunView
from tokengrad.read.meta_file import token_budget
from tokengrad.schema import SAMPLE, SAMPLE_EXTRA, TOK

# Length hacking (Singhal et al., arXiv 2310.03716: RLHF gains largely from length): mean length rises
# LENGTH_GROWTH of its start, rank correlation of length and reward above LENGTH_RHO, correctness flat.
LENGTH_GROWTH = 0.5
LENGTH_RHO = 0.2
# Truncation: completions that reach max_new_tokens without an end token (DAPO arXiv 2503.14476 Sec. 3.4:
# truncated samples add reward noise; overlong shaping).
TRUNC_WARNING = 0.1
TRUNC_CRITICAL = 0.5
TRUNC_SUSTAIN = 5
END_TOKEN_SHARE = 0.05  # a token id ending >= 5 % of the early-stopped completions counts as an end token
# Repetition: seq-rep-n = 1 - distinct n-grams / n-grams of a completion (Welleck et al., arXiv 1908.04319).
REP_N = 3
REP_MIN_WORDS = 8
REP_RATIO = 0.5
REP_SHARE = 0.2
REP_SUSTAIN = 5
# ... and loops: one span of <= REP_MAX_PERIOD words written >= REP_LOOP times back to back, the degenerate
# repetition of Holtzman et al. (arXiv 1904.09751 Sec. 2). Templated reasoning (a checked K&K trace, a tool
# call format) reuses most of its 3-grams without ever repeating a span back to back: lab-kk's correct
# 3-person traces have seq-rep-3 > 0.5 in 61 % of puzzles and no loop.
REP_LOOP = 3
REP_MAX_PERIOD = 32
# Format gaming: reward rises (Mann-Kendall) while correctness does not; the gap grows by FORMAT_GAP.
FORMAT_GAP = 0.2
_CORRECT = SAMPLE_EXTRA.correct  # the built-in trainer's 0/1 check, apart from the reward


def _per_step(s: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    per = s.groupby(SAMPLE.step)[column].mean()
    return per.index.to_numpy().astype(int), per.to_numpy(dtype=float)


def _need_samples(view: RunView, *columns: str) -> pd.DataFrame:
    """The samples, or NotChecked naming the first of `columns` no sample records."""
    s = view.samples
    if s.empty:
        raise NotChecked("the run records no samples (completions)")
    for col in columns:
        if col not in s.columns or s[col].isna().all():
            raise NotChecked(f"no sample records {col}")
    return s


def _need_steps(steps: np.ndarray, least: int = 10) -> None:
    if steps.size < least:
        raise NotChecked(f"{steps.size} steps record samples, the trend needs {least}")


def _correct_rising(s: pd.DataFrame) -> bool:
    if _CORRECT not in s.columns or s[_CORRECT].isna().all():
        return False
    steps, c = _per_step(s, _CORRECT)
    return trend(c, steps).rising(TREND_ALPHA)


@detector("length_hacking", tables=("samples",), page="inspector")
def length_hacking(view: RunView) -> list[Finding]:
    """Completions grow by half while length predicts reward (Spearman > 0.2) and correctness stays flat."""
    s = _need_samples(view, SAMPLE.length, SAMPLE.reward)
    steps, length = _per_step(s, SAMPLE.length)
    _need_steps(steps)
    tr = trend(length, steps)
    start, end, w = window_medians(length)
    if not (tr.rising(TREND_ALPHA) and start > 0 and end >= (1 + LENGTH_GROWTH) * start):
        return []
    per_step = [  # only for growing length
        spearman(g[SAMPLE.length], g[SAMPLE.reward]) for _, g in s.groupby(SAMPLE.step)
    ]
    rho = float(np.nanmedian(per_step)) if np.isfinite(per_step).any() else float("nan")
    if not rho > LENGTH_RHO or _correct_rising(s):
        return []
    # onset: the first of 5 steps in a row above the start window by 3 robust sigmas (1.4826 MAD)
    head = length[:w]
    sigma = max(1.4826 * float(np.median(np.abs(head - start))), 0.01 * start)
    run = sustained(length > start + 3 * sigma, 5)
    onset = int(steps[run[0]]) if run else int(steps[np.argmax(length > (1 + LENGTH_GROWTH) * start)])
    msg = (
        f"mean completion length rose from {fmt(start)} to {fmt(end)} tokens from step {onset} while "
        f"length predicts reward (Spearman {rho:.2f}) and correctness did not rise"
    )
    evidence = {
        "statistic": "Mann-Kendall on per-step mean length; median over steps of Spearman(length, reward)",
        "values": {"start": start, "end": end, "spearman": rho, **tr.as_dict()},
        "thresholds": {"growth": LENGTH_GROWTH, "rho": LENGTH_RHO, "alpha": TREND_ALPHA},
    }
    longest = s[s[SAMPLE.step] >= onset].nlargest(3, [SAMPLE.length, SAMPLE.reward])
    tokens = tuple(
        TokenEvidence(
            step=int(r.step), sample_id=int(r.sample_id), text=str(r.completion)[-80:], share_of="count"
        )
        for r in longest.itertuples()
    )
    actions = (
        Action("penalise length in the reward or normalise it (overlong shaping)", "DAPO, arXiv 2503.14476"),
        Action("check the reward for a length bias", "Singhal et al., arXiv 2310.03716"),
    )
    return [
        Finding(
            id="length_hacking",
            severity="warning",
            confidence=confidence_from_p(tr.p_value),
            first_step=onset,
            last_step=int(steps[-1]),
            message=msg,
            evidence=evidence,
            tokens=tokens,
            actions=actions,
        )
    ]


def _last_tokens(view: RunView) -> pd.DataFrame:
    """[step, sample_id, last_id, n] per recorded completion: its last token id and its length in tokens
    (the last position + 1), from the tokens table."""
    return view.sql(
        f"SELECT {TOK.step}, {TOK.sample_id}, arg_max({TOK.token_id}, {TOK.position}) AS last_id, "
        f"max({TOK.position}) + 1 AS n FROM tokens GROUP BY {TOK.step}, {TOK.sample_id}"
    )


def _end_tokens(last: pd.DataFrame, limit: int) -> set:
    """The token ids that end the completions stopped before the limit (END_TOKEN_SHARE of them or more)."""
    short = last[last["n"] < limit]["last_id"].value_counts(normalize=True)
    return set(short[short >= END_TOKEN_SHARE].index)


def truncated_completions(view: RunView, limit: int) -> tuple[pd.DataFrame, bool]:
    """[step, sample_id, truncated] per completion and whether end tokens were read from the tokens table
    (exact) or only the length is known (estimate: a completion at the limit may have ended there)."""
    key = [SAMPLE.step, SAMPLE.sample_id]  # a completion: its tokens' step and sample_id too
    s = view.samples[[*key, SAMPLE.length, SAMPLE.completion]].dropna(subset=[SAMPLE.length])
    if view.has_tokens:
        last = _last_tokens(view)
        ends = _end_tokens(last, limit)
        if ends:
            last["truncated"] = (last["n"] >= limit) & ~last["last_id"].isin(ends)
            return s.merge(last[[*key, "truncated"]], on=key), True
    return s.assign(truncated=s[SAMPLE.length] >= limit), False


def _token_truncation(view: RunView, limit: int) -> tuple[pd.DataFrame, bool]:
    """truncated_completions for a run without samples (the verl plugin records token rows only): each
    completion's length from its token rows, which hold every response token when no budget was kept."""
    if token_budget(view.meta) is not None:
        raise NotChecked(
            "the run records no completion lengths (samples table), and its token rows are budgeted"
        )
    last = _last_tokens(view)
    ends = _end_tokens(last, limit)
    last["truncated"] = (last["n"] >= limit) & ~last["last_id"].isin(ends)
    return last.assign(**{SAMPLE.completion: ""}), bool(ends)


def _truncated_share(view: RunView) -> tuple[np.ndarray, np.ndarray, pd.DataFrame | None, bool, str]:
    """(steps, share truncated per step, the flagged completions or None, exact, what was read): from the
    samples at the run's length limit (else, without samples, from the token rows), else from the share
    the producer logged itself (TRL's completions/clipped_ratio); NotChecked when none is there."""
    limit, logged = view.settings.max_new_tokens, view.settings.metric("truncated_share")
    if limit is not None and (not view.samples.empty or view.has_tokens):
        samples = not view.samples.empty
        flags, exact = truncated_completions(view, limit) if samples else _token_truncation(view, limit)
        if not flags.empty:
            steps, share = _per_step(flags, "truncated")
            return steps, share, flags, exact, f"max_new_tokens = {limit}"
    col = view.column(logged) if logged else None
    if col is not None:
        return col[0], col[1], None, True, f"the length limit ({logged}, logged by the trainer)"
    if limit is None:
        raise NotChecked("the length limit is unknown (no max_new_tokens in the run's settings)")
    raise NotChecked("the run records no completion lengths (samples table)")


@detector("truncation", tables=("samples", "tokens", "steps"), page="inspector")
def truncation(view: RunView) -> list[Finding]:
    """Over 10 % of the completions (critical: 50 %) stop at max_new_tokens without an end token, 5 steps."""
    steps, share, flags, exact, limit = _truncated_share(view)
    for level, threshold in (("critical", TRUNC_CRITICAL), ("warning", TRUNC_WARNING)):
        run = sustained(share > threshold, TRUNC_SUSTAIN)
        if run is None:
            continue
        a, b = run
        msg = (
            f"{pct(float(share[a:b].mean()))} of the completions hit {limit} without an end "
            f"token over steps {steps[a]}-{steps[b - 1]}" + ("" if exact else " (estimate: by length only)")
        )
        evidence = {
            "statistic": f"share of truncated completions per step, {TRUNC_SUSTAIN} steps in a row",
            "values": {
                "mean_share": float(share[a:b].mean()),
                "max_new_tokens": view.settings.max_new_tokens,
                "exact": exact,
            },
            "thresholds": {
                "warning": TRUNC_WARNING,
                "critical": TRUNC_CRITICAL,
                "sustain": TRUNC_SUSTAIN,
            },
        }
        actions = (
            Action("raise max_new_tokens or shape overlong completions", "DAPO, arXiv 2503.14476 Sec. 3.4"),
        )
        conf = min(0.99, 0.5 + 0.05 * (b - a))
        tokens = _truncated_examples(flags, steps[a], steps[b - 1], exact)
        return [
            Finding(
                id="truncation",
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


def _truncated_examples(flags: pd.DataFrame | None, first: int, last: int, exact: bool) -> tuple:
    if flags is None:
        return ()
    hits = flags[flags["truncated"] & flags[SAMPLE.step].between(first, last)].head(3)
    return tuple(
        TokenEvidence(
            step=int(r.step),
            sample_id=int(r.sample_id),
            text=str(r.completion)[-80:],
            share_of="count",
            exact=exact,
        )
        for r in hits.itertuples()
    )


def seq_rep(text: str, n: int = REP_N) -> float:
    """1 - distinct n-grams / n-grams of the whitespace words (Welleck et al., arXiv 1908.04319); NaN below
    REP_MIN_WORDS words."""
    words = str(text).split()
    if len(words) < max(REP_MIN_WORDS, n):
        return float("nan")
    grams = list(zip(*(words[i:] for i in range(n))))  # the n-grams, as tuples of words
    return 1.0 - len(set(grams)) / len(grams)


def loop(text: str, max_period: int = REP_MAX_PERIOD) -> tuple[int, int]:
    """(copies, first word) of the longest back-to-back repetition of one span of 1..max_period
    whitespace words; (1, 0) without one."""
    words = str(text).split()
    P = min(max_period, len(words) // 2)
    if P < 1:
        return 1, 0
    index: dict[str, int] = {}
    ids = np.fromiter((index.setdefault(w, len(index)) for w in words), np.int64, len(words))  # [n]
    padded = np.concatenate([ids, np.full(P, -1)])  # [n + P] no word equals the padding
    windows = np.lib.stride_tricks.sliding_window_view(padded, P + 1)[: len(ids)]  # [n, P + 1]
    same = windows[:, 1:] == windows[:, :1]  # [n, P] word i equals word i + p (column p - 1)
    # length of the stretch of matches ending at row i, per period: a cumulative sum reset at each miss
    c = np.cumsum(same, axis=0)  # [n, P]
    run = c - np.maximum.accumulate(np.where(same, 0, c), axis=0)  # [n, P]
    copies = 1 + run.max(axis=0) // np.arange(1, P + 1)  # [P]
    p = int(np.argmax(copies))  # the smallest period with the most copies
    if copies[p] < 2:
        return 1, 0
    end = int(np.argmax(run[:, p]))  # the first longest stretch for that period
    return int(copies[p]), end - int(run[end, p]) + 1


def _repetitive(s: pd.DataFrame) -> pd.DataFrame:
    """The samples with seq-rep and loop columns; repetitive = seq-rep-3 above the ratio and a loop."""
    rep = s[SAMPLE.completion].map(seq_rep)
    s = s.assign(rep=rep)[rep.notna()]
    loops = s.loc[s["rep"] > REP_RATIO, SAMPLE.completion].map(loop)  # only where seq-rep is high: cheaper
    found = pd.DataFrame(loops.tolist(), index=loops.index, columns=["copies", "loop_at"], dtype="int64")
    found = found.reindex(s.index).fillna({"copies": 1, "loop_at": 0}).astype("int64")
    s = s.assign(copies=found["copies"], loop_at=found["loop_at"])
    copies = s["copies"]
    return s.assign(repetitive=(s["rep"] > REP_RATIO) & (copies >= REP_LOOP))


@detector("repetition", tables=("samples",), page="inspector")
def repetition(view: RunView) -> list[Finding]:
    """Over 20 % of a step's completions loop (a span written 3 times back to back, over half of their
    3-grams repeated), 5 steps in a row."""
    s = _repetitive(_need_samples(view, SAMPLE.completion))
    if s.empty:
        raise NotChecked(f"every completion is under {REP_MIN_WORDS} words, seq-rep-{REP_N}'s least")
    steps, share = _per_step(s, "repetitive")
    run = sustained(share > REP_SHARE, REP_SUSTAIN)
    if run is None:
        return []
    a, b = run
    msg = (
        f"{pct(float(share[a:b].mean()))} of the completions loop (a span written {REP_LOOP}+ times back "
        f"to back, seq-rep-{REP_N} > {REP_RATIO}) over steps {steps[a]}-{steps[b - 1]}"
    )
    evidence = {
        "statistic": f"seq-rep-{REP_N} and back-to-back copies per completion; share looping, sustained",
        "values": {"mean_share": float(share[a:b].mean())},
        "thresholds": {
            "ratio": REP_RATIO,
            "loop": REP_LOOP,
            "share": REP_SHARE,
            "sustain": REP_SUSTAIN,
            "n": REP_N,
        },
    }
    hit = s[s[SAMPLE.step].between(steps[a], steps[b - 1]) & s["repetitive"]]
    tokens = tuple(
        TokenEvidence(
            step=int(r.step),
            sample_id=int(r.sample_id),
            text=" ".join(str(r.completion).split()[r.loop_at :])[:80],  # the loop, where it starts
            share=float(r.rep),
            share_of="count",
        )
        for r in hit.nlargest(3, "rep").itertuples()
    )
    actions = (Action("add a repetition penalty or stop sequences; check the reward", "arXiv 1908.04319"),)
    return [
        Finding(
            id="repetition",
            severity="warning",
            confidence=min(0.99, 0.5 + 0.05 * (b - a)),
            first_step=steps[a],
            last_step=steps[b - 1],
            message=msg,
            evidence=evidence,
            tokens=tokens,
            actions=actions,
        )
    ]


@detector("format_gaming", tables=("samples",), page="inspector")
def format_gaming(view: RunView) -> list[Finding]:
    """Reward rises while correctness does not: the reward - correct gap grows by 0.2 (Mann-Kendall)."""
    s = _need_samples(view, SAMPLE.reward, _CORRECT)  # correctness apart from the reward: the trainer's
    s = s.assign(gap=s[SAMPLE.reward] - s[_CORRECT].astype(float))
    steps, gap = _per_step(s, "gap")
    _need_steps(steps)
    tr = trend(gap, steps)
    start, end, _ = window_medians(gap)
    if not tr.rising(TREND_ALPHA) or end - start < FORMAT_GAP or _correct_rising(s):
        return []
    onset = int(steps[np.argmax(gap > start + FORMAT_GAP)])
    msg = (
        f"reward rose {fmt(end - start)} above correctness (gap {fmt(start)} -> {fmt(end)}) from step "
        f"{onset} while correctness did not rise: the reward pays for something else (format?)"
    )
    evidence = {
        "statistic": "Mann-Kendall on per-step mean(reward - correct); correctness trend",
        "values": {"start": start, "end": end, **tr.as_dict()},
        "thresholds": {"gap": FORMAT_GAP, "alpha": TREND_ALPHA},
    }
    gamed = s[(s[SAMPLE.step] >= onset) & (s[_CORRECT] == 0)].nlargest(3, SAMPLE.reward)
    tokens = tuple(
        TokenEvidence(
            step=int(r.step), sample_id=int(r.sample_id), text=str(r.completion)[:80], share_of="count"
        )
        for r in gamed.itertuples()
    )
    actions = (
        Action("lower the format reward's weight or gate it on correctness", "arXiv 2501.12948 Sec. 2.2.2"),
    )
    return [
        Finding(
            id="format_gaming",
            severity="warning",
            confidence=confidence_from_p(tr.p_value),
            first_step=onset,
            last_step=int(steps[-1]),
            message=msg,
            evidence=evidence,
            tokens=tokens,
            actions=actions,
        )
    ]
