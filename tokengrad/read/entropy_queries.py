"""Queries over the entropy attribution columns (Attribution(entropy=True); record/attribution/entropy.py),
in DuckDB like tokengrad.read.queries:

    entropy_drainers(run, steps=(100, 200), k=20)   # the tokens whose gradients drained the most entropy
    entropy_quadrants(run)                           # probability bucket x advantage sign
    entropy_by_position(run, bins=10)                # where along the completion the entropy moved
    entropy_steps(run)                               # predicted / measured mean-entropy change per step

A token's drain is the part of the first-order entropy change its gradient makes,

    drain_t = coef_t <grad log pi_t, grad H> = entropy_share_t * <grad H, g>     (steps.entropy_grad_dot)

so a gradient step -eta g changes the mean entropy H by -eta sum_t drain_t: a positive drain lowers the
entropy. A step of several updates records the token-weighted mean of <grad H, g> over them, so drains
are exact for steps of one update and use that mean otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tokengrad.read.token_sql import Where, bin_edges, bin_index, token_where
from tokengrad.schema import DEFAULT_BUCKET_EDGES, STEP, TOK

DRAIN = "entropy_drain"  # query column: entropy_share * steps.entropy_grad_dot (not stored)
_DRAIN_SQL = f"{TOK.entropy_share} * {STEP.entropy_grad_dot}"
# token rows with their step's <grad H, g>, so the selection helpers of tokengrad.read.queries apply
_FROM = (
    f"(SELECT t.*, s.{STEP.entropy_grad_dot} FROM tokens t LEFT JOIN (SELECT {STEP.step}, {STEP.rank}, "
    f"{STEP.entropy_grad_dot} FROM steps) s USING ({TOK.step}, {TOK.rank}))"
)
DRAINER_COLUMNS = (
    TOK.step,
    TOK.update_id,
    TOK.sample_id,
    TOK.position,
    TOK.token,
    TOK.prob,
    TOK.advantage,
    TOK.entropy,
    TOK.entropy_share,
    TOK.dentropy_pred,
    TOK.dentropy,
)
STEP_COLUMNS = (
    STEP.step,
    STEP.entropy_mean,
    STEP.dentropy_mean_pred,
    STEP.dentropy_mean,
    STEP.entropy_grad_dot,
    STEP.entropy_share_residual,
    STEP.cov_logprob_adv,
    STEP.lr,
)


def _where(steps: tuple[int, int] | None) -> Where:
    """Loss tokens with an entropy share, in the step range (NaN: an update without a gradient)."""
    return token_where(steps, True, None).add(f"isfinite({TOK.entropy_share})")


def entropy_steps(run) -> pd.DataFrame:
    """One row per entropy-attributed step (rank 0): mean entropy before, predicted and measured change of
    the mean entropy along the applied update, <grad H, g>, the shares' residual and Cov(log pi, A)."""
    df = run.steps
    if STEP.dentropy_mean not in df.columns or df.empty:
        return pd.DataFrame(columns=list(STEP_COLUMNS))
    df = df[df[STEP.rank] == df[STEP.rank].min()] if STEP.rank in df.columns else df
    have = df[STEP.dentropy_mean_pred].notna() | df[STEP.entropy_grad_dot].notna()
    cols = [c for c in STEP_COLUMNS if c in df.columns]
    return df.loc[have, cols].sort_values(STEP.step).reset_index(drop=True)


def entropy_drainers(run, steps: tuple[int, int] | None = None, k: int = 20) -> pd.DataFrame:
    """The k loss tokens of the step range with the largest drain (their gradients lowered the mean
    entropy the most): DRAINER_COLUMNS plus `entropy_drain` and its share of the range's summed drain
    (`drain_share`; the drains of all tokens of an update sum to <grad H, g> minus the residual's part).
    Empty without entropy attribution (older runs, or steps without it)."""
    if int(k) < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    w = _where(steps)
    cols = ", ".join(DRAINER_COLUMNS)
    q = (
        f"SELECT {cols}, {_DRAIN_SQL} AS {DRAIN}, "
        f"{_DRAIN_SQL} / nullif(sum({_DRAIN_SQL}) OVER (), 0) AS drain_share FROM {_FROM}{w.sql()} "
        f"ORDER BY {DRAIN} DESC NULLS LAST, {TOK.step}, {TOK.sample_id}, {TOK.position} LIMIT ?"
    )
    return run.sql(q, w.params + [int(k)])


def _n_updates(run, w: Where) -> int:
    q = f"SELECT count(*) AS n FROM (SELECT DISTINCT {TOK.step}, {TOK.update_id} FROM {_FROM}{w.sql()})"
    return int(run.sql(q, w.params)["n"].iloc[0])


def _binned(run, w: Where, index: str, index_params: list) -> pd.DataFrame:
    """Per bin b (and advantage sign): tokens, summed share and drain per update, mean predicted and
    measured per-position entropy change."""
    q = (
        f"SELECT {index} AS b, CAST(sign({TOK.advantage}) AS INTEGER) AS adv_sign, count(*) AS n_tokens, "
        f"sum({TOK.entropy_share}) AS {TOK.entropy_share}, sum({_DRAIN_SQL}) AS {DRAIN}, "
        f"avg({TOK.dentropy_pred}) AS {TOK.dentropy_pred}, avg({TOK.dentropy}) AS {TOK.dentropy} "
        f"FROM {_FROM}{w.sql()} GROUP BY b, adv_sign ORDER BY b, adv_sign"
    )
    out = run.sql(q, index_params + w.params)
    n_up = max(_n_updates(run, w), 1)
    for c in (TOK.entropy_share, DRAIN):  # per update, so a partition's shares sum to 1 - residual
        out[c] = out[c].astype(float) / n_up
    return out


def entropy_quadrants(
    run, steps: tuple[int, int] | None = None, edges: Sequence[float] = DEFAULT_BUCKET_EDGES
) -> pd.DataFrame:
    """[lo, hi, adv_sign, n_tokens, entropy_share, entropy_drain, dentropy_pred, dentropy] per probability
    bucket x advantage sign (the quadrants the low-probability-token papers argue about): entropy_share
    and entropy_drain summed per update (a cell's part of its update's entropy change along the
    gradient), dentropy_pred / dentropy the mean per-position change along the applied update."""
    e = bin_edges(list(edges))
    index, inner = bin_index(TOK.prob, e)
    out = _binned(run, _where(steps), index, inner)
    b = out.pop("b").to_numpy(int)
    out.insert(0, "lo", e[b])
    out.insert(1, "hi", e[b + 1])
    return out


def entropy_by_position(run, steps: tuple[int, int] | None = None, bins: int = 10) -> pd.DataFrame:
    """The same columns as entropy_quadrants over `bins` equal-width position bins (lo/hi are
    positions; both advantage signs summed)."""
    w = _where(steps)
    top = run.sql(f"SELECT max({TOK.position}) AS m FROM {_FROM}{w.sql()}", w.params)["m"].iloc[0]
    e = np.linspace(0, (0 if pd.isna(top) else int(top)) + 1, int(bins) + 1)
    index, inner = bin_index(TOK.position, e)
    per = _binned(run, w, index, inner)
    if per.empty:
        return pd.DataFrame(columns=["lo", "hi", "n_tokens", TOK.entropy_share, DRAIN, TOK.dentropy])
    per["w_pred"] = per[TOK.dentropy_pred] * per["n_tokens"]
    per["w_meas"] = per[TOK.dentropy] * per["n_tokens"]
    g = per.groupby("b")[["n_tokens", TOK.entropy_share, DRAIN, "w_pred", "w_meas"]].sum()
    g[TOK.dentropy_pred] = g.pop("w_pred") / g["n_tokens"]
    g[TOK.dentropy] = g.pop("w_meas") / g["n_tokens"]
    g.insert(0, "lo", e[g.index.to_numpy(int)])
    g.insert(1, "hi", e[g.index.to_numpy(int) + 1])
    return g.reset_index(drop=True)
