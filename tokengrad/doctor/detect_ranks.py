"""Integrity across ranks: each rank of a multi-process run records its own share of every step's batch, so a
rank that recorded no token rows leaves that share out of every per-token figure, and two ranks that give
their completions the same sample ids make the run's (step, sample_id, position) key name two tokens (the
run format asks for sample ids unique within a step over all passes and ranks: docs/api.md, st.track).
Neither is visible in one rank's files; both are silent: every figure still computes."""

from __future__ import annotations

import pandas as pd

from tokengrad.doctor.finding import Action, Finding, NotChecked, TokenEvidence
from tokengrad.doctor.registry import detector, pct
from tokengrad.doctor.view import RunView
from tokengrad.schema import STEP, TOK

_SHOWN = 10  # evidence rows and listed ranks per finding
# A live diagnosis sees a rank's steps row a moment before its token rows (one commit writes the tables
# one after the other): a rank is flagged once it has steps rows on this many steps and no token row.
MIN_STEPS = 2


def _ranks(view: RunView, table: str) -> pd.DataFrame:
    """(rank, steps): the ranks with rows in `table` and on how many steps."""
    cut = view.step_cut() if table != "tokens" else ""  # view.sql cuts the tokens table itself
    return view.sql(f"SELECT {STEP.rank}, count(DISTINCT {STEP.step}) AS steps FROM {table}{cut} GROUP BY 1")


def _missing_ranks(view: RunView) -> tuple[list[int], set[int]]:
    """The ranks expected to hold token rows that hold none, and the ranks that do."""
    with_tokens = set(_ranks(view, "tokens")[TOK.rank].astype(int))
    steps = _ranks(view, "steps")
    expected = {int(r) for r, n in zip(steps[STEP.rank], steps["steps"]) if n >= MIN_STEPS}
    world = view.meta.get("world_size")
    if view.upto is None and view.meta.get("finished") is True and isinstance(world, int) and world > 1:
        expected |= set(range(world))  # a finished run: every rank it was started with
    return sorted(expected - with_tokens), with_tokens


@detector("rank_without_tokens", tables=("tokens", "steps"), about="data")
def rank_without_tokens(view: RunView) -> list[Finding]:
    """A rank of the run that recorded no token row while others did (its tokens/rankRRR folder missing or
    empty): that rank's share of each step's batch is absent from every per-token figure."""
    if not view.has_tokens:
        raise NotChecked("the run has no token rows")
    missing, present = _missing_ranks(view)
    if not missing:
        return []
    span = view.sql(f"SELECT min({STEP.step}) AS a, max({STEP.step}) AS b FROM steps{view.step_cut()}")
    first, last = (None, None) if pd.isna(span["a"][0]) else (int(span["a"][0]), int(span["b"][0]))
    world = view.meta.get("world_size")
    share = len(missing) / max(len(missing) + len(present), 1)
    msg = (
        f"rank(s) {', '.join(map(str, missing[:_SHOWN]))} recorded no token rows while rank(s) "
        f"{', '.join(map(str, sorted(present)[:_SHOWN]))} did (world_size {world}): {pct(share)} of the "
        "ranks' batches are missing from every per-token figure"
    )
    evidence = {
        "statistic": "ranks with steps rows (or of a finished run's world_size) and no token row",
        "values": {"missing": missing[:_SHOWN], "with_tokens": sorted(present)[:_SHOWN], "world_size": world},
        "thresholds": {"min_steps": MIN_STEPS},
    }
    action = Action(
        "check that every rank records (each process opens its own Recorder on the same run directory) "
        "and that its tokens/rankRRR folder was not lost in a copy",
        "docs/scale.md",
    )
    return [
        _finding(
            "rank_without_tokens", "warning", span=(first, last), msg=msg, evidence=evidence, action=action
        )
    ]


def _finding(name: str, severity: str, *, span: tuple, msg: str, evidence: dict, action: Action, tokens=()):
    """A finding of this module: exact counts (confidence 1), one action."""
    return Finding(
        id=name,
        severity=severity,
        confidence=1.0,
        first_step=span[0],
        last_step=span[1],
        message=msg,
        evidence=evidence,
        tokens=tokens,
        actions=(action,),
    )


def _repeated(view: RunView) -> pd.DataFrame:
    """(step, sample_id, ranks, n) of the sample ids that more than one rank recorded token rows for."""
    return view.sql(
        f"SELECT {TOK.step}, {TOK.sample_id}, count(DISTINCT {TOK.rank}) AS n, "
        f"list_sort(list(DISTINCT {TOK.rank})) AS ranks "
        f"FROM tokens GROUP BY {TOK.step}, {TOK.sample_id} HAVING count(DISTINCT {TOK.rank}) > 1 "
        f"ORDER BY {TOK.step}, {TOK.sample_id}"
    )


@detector("sample_id_repeated", page="inspector", tables=("tokens",), about="data")
def sample_id_repeated(view: RunView) -> list[Finding]:
    """One sample id recorded by several ranks in one step: two completions under one key, so per-sample
    figures (rewards, lengths, a sample's tokens) mix them."""
    if not view.has_tokens:
        raise NotChecked("the run has no token rows")
    ranks = view.sql(f"SELECT count(DISTINCT {TOK.rank}) AS n FROM tokens")["n"].iloc[0]
    if ranks < 2:
        raise NotChecked("the token rows come from one rank")
    rep = _repeated(view)
    if rep.empty:
        return []
    total = view.sql(f"SELECT count(DISTINCT ({TOK.step}, {TOK.sample_id})) AS n FROM tokens")["n"].iloc[0]
    share = len(rep) / max(int(total), 1)
    first = rep.iloc[0]
    on = ", ".join(str(int(r)) for r in first["ranks"])
    msg = (
        f"{len(rep)} sample id(s) over {rep[TOK.step].nunique()} step(s) were recorded by several ranks "
        f"({pct(share)} of the step's sample ids; first: step {int(first[TOK.step])} sample "
        f"{int(first[TOK.sample_id])} on ranks {on}): per-sample figures mix their completions"
    )
    evidence = {
        "statistic": "(step, sample_id) with token rows from more than one rank",
        "values": {
            "sample_ids": len(rep),
            "share": share,
            "steps": sorted({int(s) for s in rep[TOK.step]})[:20],
        },
    }
    action = Action(
        "give each rank's completions global ids (e.g. rank * per_rank + index) in st.track and st.samples",
        "docs/api.md",
    )
    level = "critical" if share >= 0.5 else "warning"
    span = (int(rep[TOK.step].min()), int(rep[TOK.step].max()))
    evidence_rows = TokenEvidence.from_rows(rep.head(_SHOWN))
    return [
        _finding(
            "sample_id_repeated",
            level,
            span=span,
            msg=msg,
            evidence=evidence,
            action=action,
            tokens=evidence_rows,
        )
    ]
