"""Each probability bucket's share of the tokens and of the gradient, over the live steps of a range: the
AR-Lopti view (arXiv 2505.12929, Fig. 1) that the dashboard's headline figure draws, on every run.

    gradient_by_bucket(run, (0, 0.25, 0.5, 0.75, 1), step_range=(0, 100))
    # -> lo, hi, count, token_share, grad_sum, grad_share[, update_sum, update_share]

A token's gradient is its exact logit-gradient norm logit_grad_norm = |coef| |p - e_y| (|coef| where that
was not recorded); a bucket's share is its sum over the sum for all tokens. Where per-token attribution
was recorded, the bucket's summed update_share is its share of the update itself. Steps whose every
advantage is 0 have no gradient and are left out (figures.liveness).

Source: a run recorded with a token budget keeps only some token rows, so its exact per-step histogram
(the prob_bins table, summed over every loss token) is used whenever the requested edges fall on its bin
edges; otherwise the token table, aggregated in DuckDB. Every in-loss row of every update counts, so with
Lopti each token counts in the phase that trained it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tokengrad.read.token_sql import GRAD, bin_edges, binned, token_where
from tokengrad.schema import BIN, PBIN, TOK

UPDATE_SHARE = "update_share"  # per-token <g_t, g>/|g|^2, where the run recorded attribution
_EDGE_TOL = 1e-6  # prob_bins edges are float32


def token_columns(run) -> list[str]:
    """Columns the run's token table has (those of its files, read by name)."""
    return list(run.sql("SELECT * FROM tokens LIMIT 0").columns)


def step_gradients(run, *, loss_only: bool = True) -> pd.DataFrame:
    """[step, n_tokens, grad_sum, live] per step with token rows: grad_sum = sum of the in-loss tokens'
    logit_grad_norm (|coef| where it was not recorded); live = grad_sum > 0. A step whose every advantage
    is 0 has coef = 0 on every token and is not live (figures.liveness)."""
    w = token_where(None, loss_only, None)
    q = (
        f"SELECT {TOK.step}, count(*) AS n_tokens, sum({GRAD}) AS grad_sum FROM tokens{w.sql()} "
        f"GROUP BY {TOK.step} ORDER BY {TOK.step}"
    )
    df = run.sql(q, w.params)
    df["live"] = df["grad_sum"].fillna(0) > 0
    return df


def _from_tokens(run, e: np.ndarray, step_range, live_only: bool, loss_only: bool) -> pd.DataFrame:
    w = token_where(step_range, loss_only, None)
    if live_only:
        w.add(
            f"{TOK.step} IN (SELECT {TOK.step} FROM tokens{token_where(None, loss_only, None).sql()} "
            f"GROUP BY {TOK.step} HAVING sum({GRAD}) > 0)"
        )
    has_update = UPDATE_SHARE in token_columns(run)
    select = f"sum({GRAD}) AS grad_sum" + (f", sum({UPDATE_SHARE}) AS update_sum" if has_update else "")
    return binned(run, e, select, w)


def _bin_steps(run, step_range) -> pd.DataFrame:
    """[step, grad_sum] of the prob_bins table (exact over every loss token of the step)."""
    where = f" WHERE {PBIN.step} BETWEEN ? AND ?" if step_range else ""
    return run.sql(
        f"SELECT {PBIN.step}, sum({PBIN.sum_logit_grad_norm}) AS grad_sum FROM prob_bins{where} "
        f"GROUP BY {PBIN.step} ORDER BY {PBIN.step}",
        [int(s) for s in step_range or ()],
    )


def _from_prob_bins(run, e: np.ndarray, steps: list[int]) -> pd.DataFrame | None:
    """The buckets from the prob_bins rows of `steps`; None when a bin straddles a requested edge."""
    if not steps:
        return pd.DataFrame(
            {BIN.lo: e[:-1], BIN.hi: e[1:], BIN.count: 0, "grad_sum": np.nan, "update_sum": np.nan}
        )
    bins = run.sql(
        f"SELECT {PBIN.lo}, {PBIN.hi}, sum({PBIN.n_tokens}) AS n, sum({PBIN.sum_logit_grad_norm}) AS g, "
        f"sum({PBIN.sum_update_share}) AS u FROM prob_bins WHERE list_contains(?, {PBIN.step}) "
        f"GROUP BY ALL",
        [steps],
    )
    k = np.searchsorted(e, ((bins[PBIN.lo] + bins[PBIN.hi]) / 2).to_numpy(), side="right") - 1
    k = np.clip(k, 0, len(e) - 2)
    if ((bins[PBIN.lo] < e[k] - _EDGE_TOL) | (bins[PBIN.hi] > e[k + 1] + _EDGE_TOL)).any():
        return None
    grouped = bins.groupby(k)
    out = pd.DataFrame({BIN.lo: e[:-1], BIN.hi: e[1:]})
    out[BIN.count] = grouped["n"].sum().reindex(range(len(e) - 1)).fillna(0).astype("int64").to_numpy()
    out["grad_sum"] = grouped["g"].sum(min_count=1).reindex(range(len(e) - 1)).to_numpy()
    out["update_sum"] = grouped["u"].sum(min_count=1).reindex(range(len(e) - 1)).to_numpy()
    return out


def _shares(out: pd.DataFrame) -> pd.DataFrame:
    total = out[BIN.count].sum()
    out["token_share"] = out[BIN.count] / total if total else np.nan
    out["grad_sum"] = out["grad_sum"].fillna(0.0)
    g = out["grad_sum"].sum()
    out["grad_share"] = out["grad_sum"] / g if g > 0 else np.nan
    if "update_sum" in out and out["update_sum"].isna().all():  # recorded nowhere: no attribution
        out = out.drop(columns="update_sum")
    if "update_sum" in out:
        out["update_sum"] = out["update_sum"].fillna(0.0)
        u = out["update_sum"].sum()
        out[UPDATE_SHARE] = out["update_sum"] / u if u != 0 else np.nan
    return out


def gradient_by_bucket(
    run,
    edges: Sequence[float] | int = (0.0, 0.25, 0.5, 0.75, 1.0),
    *,
    step_range: tuple[int, int] | None = None,
    live_only: bool = True,
    loss_only: bool = True,
) -> pd.DataFrame:
    """Per probability bucket: its share of loss tokens and its share of the per-token gradient.

    Columns lo, hi, count, token_share, grad_sum, grad_share (= sum of logit_grad_norm in the bucket /
    sum over all buckets), and update_sum, update_share where some step recorded per-token attribution.
    live_only keeps the steps with a gradient. attrs: n_steps (steps in the range), n_live (of them with
    a gradient), steps (those used), source ("prob_bins" or "tokens"); module doc for the source.
    """
    e = bin_edges(edges)
    per_step = _bin_steps(run, step_range) if loss_only else pd.DataFrame()
    out, source = None, "prob_bins"
    if len(per_step):
        per_step["live"] = per_step["grad_sum"].fillna(0) > 0
        used = per_step.loc[per_step["live"] | (not live_only), PBIN.step].astype(int).tolist()
        out = _from_prob_bins(run, e, used)
    if out is None:
        source = "tokens"
        per_step = step_gradients(run, loss_only=loss_only)
        if step_range is not None:
            per_step = per_step[per_step[TOK.step].between(*step_range)]
        out = _from_tokens(run, e, step_range, live_only, loss_only)
    out = _shares(out)
    out.attrs.update(
        n_steps=int(len(per_step)),
        n_live=int(per_step["live"].sum()),
        source=source,
        steps=[int(s) for s in per_step.loc[per_step["live"] | (not live_only), TOK.step]],
    )
    return out
