"""The SQL pieces every token-table aggregation is built from: which rows count, how a token's gradient is
read, and probability (or position) bins. One home, so tokengrad.read.queries and its siblings
(share_queries, gradient_shares, rollout_queries, entropy_queries) select rows the same way.

    w = token_where(step_range=(0, 100), loss_only=True, update_id=None)    # step range, update, in-loss
    w.add(ADV_SIGN_SQL[1])                                                 # and advantage > 0
    run.sql(f"SELECT sum({GRAD}) AS g FROM tokens{w.sql()}", w.params)
    binned(run, bin_edges(10), "avg(entropy) AS entropy", w)              # [lo, hi, count, entropy]

A run is anything with `sql(query, params) -> DataFrame` over views named after the tables
(tokengrad.read.runs.Run).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from tokengrad.schema import BIN, TOK

ADV_SIGN_SQL = {1: f"{TOK.advantage} > 0", -1: f"{TOK.advantage} < 0", 0: f"{TOK.advantage} = 0"}
# A token's contribution to the step's gradient: the exact norm at its logits, else |coef| (same ordering
# within a step when logit_grad_unit was not recorded).
GRAD = f"coalesce({TOK.logit_grad_norm}, abs({TOK.coef}), 0)"


class Where:
    """AND-ed SQL conditions with their positional parameters, in order."""

    def __init__(self):
        self.conds: list[str] = []
        self.params: list = []

    def add(self, cond: str, *params) -> "Where":
        self.conds.append(cond)
        self.params += list(params)
        return self

    def sql(self) -> str:
        return " WHERE " + " AND ".join(self.conds) if self.conds else ""


def token_where(step_range: tuple[int, int] | None, loss_only: bool, update_id: int | None) -> Where:
    """The token rows an aggregation reads: steps lo..hi (inclusive), one update, in-loss rows only."""
    w = Where()
    if step_range is not None:
        lo, hi = (int(s) for s in step_range)
        if lo > hi:
            raise ValueError(f"step_range must be (lo, hi) with lo <= hi, got {step_range}")
        w.add(f"{TOK.step} BETWEEN ? AND ?", lo, hi)
    if update_id is not None:
        w.add(f"{TOK.update_id} = ?", int(update_id))
    if loss_only:
        w.add(TOK.in_loss)
    return w


def bin_edges(bins: int | Sequence[float]) -> np.ndarray:
    """Bin edges over [0, 1]: `bins` equal-width bins, or the given increasing edges."""
    if isinstance(bins, (int, np.integer)):
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        return np.linspace(0.0, 1.0, int(bins) + 1)
    edges = np.asarray(bins, dtype=float)
    if edges.ndim != 1 or edges.size < 2 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"bin edges must be at least two strictly increasing numbers, got {list(bins)}")
    return edges


def bin_index(column: str, edges: np.ndarray) -> tuple[str, list[float]]:
    """(SQL, parameters) of a row's bin: the number of interior edges <= its `column`, so bin i is
    [e_i, e_{i+1}) and the top edge is inclusive."""
    inner = [float(e) for e in edges[1:-1]]
    return (" + ".join([f"CAST({column} >= ? AS INTEGER)"] * len(inner)) or "0"), inner


def binned(run, edges: np.ndarray, select: str, w: Where, column: str = TOK.prob) -> pd.DataFrame:
    """Rows of `select` aggregates grouped by bin of `column` (default the probability; bin_index), all
    bins present (count 0 if empty); tokens outside [e_0, e_last] are left out."""
    index, inner = bin_index(column, edges)
    w.add(f"{column} BETWEEN ? AND ?", float(edges[0]), float(edges[-1]))
    q = (
        f"SELECT b, count(*) AS {BIN.count}{', ' + select if select else ''} FROM "
        f"(SELECT {index} AS b, * FROM tokens{w.sql()}) GROUP BY b ORDER BY b"
    )
    got = run.sql(q, inner + w.params).set_index("b")
    frame = pd.DataFrame({BIN.lo: edges[:-1], BIN.hi: edges[1:]})
    out = frame.join(got, how="left")
    out[BIN.count] = out[BIN.count].fillna(0).astype("int64")
    return out.reset_index(drop=True)
