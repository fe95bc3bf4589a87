"""Queries over per-token update shares (attribution steps) and the exact aggregate tables of budgeted runs
(prob_bins, vocab), in DuckDB like tokengrad.read.queries, rows selected by tokengrad.read.token_sql.

    share_by_partition(run, by="entropy_quantile", bins=5)   # -> [lo, hi, count, token_share, update_share]
    prob_bin_histogram(run)                                   # the exact per-bin sums of a budgeted run
    vocab_frequencies(run, 0.0, 0.25, value="update_share")   # word clouds when token rows are a sample
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tokengrad.read.token_sql import ADV_SIGN_SQL, Where, bin_edges, token_where
from tokengrad.schema import BIN, TOK


def attributed_steps(run) -> int:
    """How many steps carry per-token attribution (tokens.update_share recorded; 0 on older runs)."""
    q = f"SELECT count(DISTINCT {TOK.step}) AS n FROM tokens WHERE {TOK.update_share} IS NOT NULL"
    return int(run.sql(q)["n"].iloc[0])


# ---- update shares (attribution steps) and the exact aggregates of budgeted runs ---------------------
# update_share_t = coef_t <grad log pi_t, g> / |g|^2 (record/attribution/shares.py): the share of any set
# of tokens is the sum of its tokens' shares. Summed over several updates, a partition's shares are
# divided by the number of updates that have shares, so the column is its mean share of one update.
PARTITIONS = ("prob", "entropy_quantile", "adv_sign", "position")
SHARE = TOK.update_share


def _n_updates(run, w: Where) -> int:
    q = (
        f"SELECT count(*) AS n FROM (SELECT DISTINCT {TOK.step}, {TOK.update_id} FROM tokens{w.sql()} "
        f"{'AND' if w.conds else 'WHERE'} {SHARE} IS NOT NULL)"
    )
    return int(run.sql(q, w.params)["n"].iloc[0])


def share_by_partition(
    run,
    by: str = "prob",
    bins: int | Sequence[float] = 10,
    *,
    step_range: tuple[int, int] | None = None,
    update_id: int | None = None,
) -> pd.DataFrame:
    """[lo, hi, count, token_share, update_share] of the loss tokens split by `by`:

    - "prob": equal-width probability bins (or the given edges);
    - "entropy_quantile": `bins` quantiles of the entropy over the selected tokens (lo/hi are entropies);
    - "adv_sign": negative, zero, positive advantage (lo = hi = -1, 0, 1);
    - "position": equal-width bins of the token position (or the given edges).

    update_share is the partition's summed token shares per update (NaN without attribution steps);
    shares of all partitions plus the buckets table's residual sum to 1. On a budgeted run the token
    rows are a sample: prob and adv_sign partitions exact over all tokens come from prob_bin_histogram.
    """
    if by not in PARTITIONS:
        raise ValueError(f"unknown partition {by!r}; known: {list(PARTITIONS)}")
    w = token_where(step_range, True, update_id)
    n_up = _n_updates(run, token_where(step_range, True, update_id))
    if by == "adv_sign":
        q = (
            f"SELECT CAST(sign({TOK.advantage}) AS INTEGER) AS lo, count(*) AS {BIN.count}, "
            f"sum({SHARE}) AS s FROM tokens{w.sql()} GROUP BY lo ORDER BY lo"
        )
        out = run.sql(q, w.params)
        out.insert(1, BIN.hi, out["lo"])
    else:
        col, edges = _partition_edges(run, by, bins, step_range, update_id)
        inner = edges[1:-1].tolist()
        index = " + ".join([f"CAST({col} >= ? AS INTEGER)"] * len(inner)) or "0"
        w.add(f"{col} BETWEEN ? AND ?", float(edges[0]), float(edges[-1]))
        q = (
            f"SELECT b, count(*) AS {BIN.count}, sum({SHARE}) AS s FROM "
            f"(SELECT {index} AS b, * FROM tokens{w.sql()}) GROUP BY b ORDER BY b"
        )
        got = run.sql(q, inner + w.params).set_index("b")
        out = pd.DataFrame({BIN.lo: edges[:-1], BIN.hi: edges[1:]}).join(got, how="left")
        out = out.reset_index(drop=True)
        out[BIN.count] = out[BIN.count].fillna(0).astype("int64")
    total = max(int(out[BIN.count].sum()), 1)
    out["token_share"] = out[BIN.count] / total
    out[SHARE] = out.pop("s").astype(float) / n_up if n_up else np.nan
    return out


def _partition_edges(run, by: str, bins, step_range, update_id) -> tuple[str, np.ndarray]:
    if by == "prob":
        return TOK.prob, bin_edges(bins)
    if by == "position":
        if isinstance(bins, (int, np.integer)):
            w = token_where(step_range, True, update_id)
            top = run.sql(f"SELECT max({TOK.position}) AS m FROM tokens{w.sql()}", w.params)["m"].iloc[0]
            top = 0 if pd.isna(top) else int(top)
            return TOK.position, np.linspace(0, top + 1, int(bins) + 1)
        return TOK.position, bin_edges(bins)
    if not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"entropy quantiles need an integer number of bins >= 1, got {bins!r}")
    w = token_where(step_range, True, update_id)
    qs = [i / int(bins) for i in range(int(bins) + 1)]
    got = run.sql(f"SELECT quantile_cont({TOK.entropy}, ?) AS e FROM tokens{w.sql()}", [qs] + w.params)["e"]
    e = got.iloc[0]
    if e is None or len(e) == 0 or any(pd.isna(x) for x in e):
        return TOK.entropy, np.linspace(0.0, 1.0, int(bins) + 1)  # no entropy recorded: empty bins
    edges = np.maximum.accumulate(np.asarray(e, dtype=float))
    edges[1:] = np.maximum(edges[1:], edges[:-1] + 1e-12)  # ties of quantiles: strictly increasing
    return TOK.entropy, edges


PROB_BIN_MEANS = ("prob", "entropy", "logit_grad_unit", "abs_coef", "logit_grad_norm", "head_grad_norm")


def prob_bin_histogram(
    run,
    *,
    step_range: tuple[int, int] | None = None,
    update_id: int | None = None,
    adv_sign: int | None = None,
) -> pd.DataFrame:
    """From the prob_bins table (exact over every token of a budgeted run): [lo, hi, count, <means of
    PROB_BIN_MEANS>, update_share] per probability bin; update_share is the bin's share per update."""
    w = Where()
    if step_range is not None:
        w.add("step BETWEEN ? AND ?", int(step_range[0]), int(step_range[1]))
    if update_id is not None:
        w.add("update_id = ?", int(update_id))
    if adv_sign is not None:
        if adv_sign not in ADV_SIGN_SQL:
            raise ValueError(f"adv_sign must be one of {sorted(ADV_SIGN_SQL)} or None, got {adv_sign!r}")
        w.add("adv_sign = ?", int(adv_sign))
    means = ", ".join(f"sum(sum_{c}) / nullif(sum(n_tokens), 0) AS {c}" for c in PROB_BIN_MEANS)
    q = (
        f"SELECT lo, hi, sum(n_tokens) AS {BIN.count}, {means}, sum(sum_update_share) AS s, "
        f"count(DISTINCT CASE WHEN sum_update_share IS NOT NULL THEN step * 65536 + update_id END) AS u "
        f"FROM prob_bins{w.sql()} GROUP BY lo, hi ORDER BY lo"
    )
    out = run.sql(q, w.params)
    n_up = int(out.pop("u").max()) if len(out) else 0
    out[SHARE] = out.pop("s").astype(float) / n_up if n_up else np.nan
    return out


def vocab_frequencies(
    run,
    prob_lo: float = 0.0,
    prob_hi: float = 1.0,
    *,
    step_range: tuple[int, int] | None = None,
    adv_sign: int | None = None,
    value: str = BIN.count,
    limit: int = 200,
) -> pd.DataFrame:
    """[token, count, prob_mean, update_share] from the vocab table (budgeted runs, whose token rows are
    a sample): each step's top tokens, exact counts and sums. Probability buckets count when they lie in
    [prob_lo, prob_hi] (the recorder's bucket edges are the resolution). Ordered by `value`: "count" or
    "update_share" (summed share of the update, for word clouds sized by it)."""
    if value not in (BIN.count, SHARE):
        raise ValueError(f"value must be {BIN.count!r} or {SHARE!r}, got {value!r}")
    if not 0.0 <= prob_lo < prob_hi <= 1.0:
        raise ValueError(f"need 0 <= prob_lo < prob_hi <= 1, got prob_lo={prob_lo}, prob_hi={prob_hi}")
    w = Where().add("lo >= ? - 1e-6", float(prob_lo)).add("hi <= ? + 1e-6", float(prob_hi))
    if step_range is not None:
        w.add("step BETWEEN ? AND ?", int(step_range[0]), int(step_range[1]))
    if adv_sign is not None:
        if adv_sign not in ADV_SIGN_SQL:
            raise ValueError(f"adv_sign must be one of {sorted(ADV_SIGN_SQL)} or None, got {adv_sign!r}")
        w.add("adv_sign = ?", int(adv_sign))
    name = "coalesce(nullif(any_value(token), ''), '#' || CAST(token_id AS VARCHAR))"
    order = BIN.count if value == BIN.count else f"abs({SHARE})"
    q = (
        f"SELECT {name} AS {TOK.token}, sum(n_tokens) AS {BIN.count}, "
        f"sum(sum_prob) / nullif(sum(n_tokens), 0) AS prob_mean, sum(sum_update_share) AS {SHARE} "
        f"FROM vocab{w.sql()} GROUP BY token_id ORDER BY {order} DESC NULLS LAST, {TOK.token} LIMIT ?"
    )
    return run.sql(q, w.params + [int(limit)])
