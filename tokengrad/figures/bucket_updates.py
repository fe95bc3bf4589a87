"""Which analysed updates the bucket figures average, and the caption that says so.

    analysed_updates(run.buckets, step_range=(0, 100))    # [step, rank, update_id, live, empty]
    analysis_note(analysed_updates(run.buckets))          # '3 of 8 analysed updates had a gradient (...)'
    live_rows(run.buckets)                                # the bucket rows those figures average

An update is analysed when a bucket pass recorded some bucket's gradient norm; it counts when it had a
gradient (an update whose every bucket norm is 0 had all advantages 0: its shares are undefined, its
norms are not small values). Every figure of tokengrad.figures.buckets takes its rows from here, so the
figures on a page average the same updates and their captions agree.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from tokengrad.schema import BUCKET

UPDATE_KEYS = [BUCKET.step, BUCKET.rank, BUCKET.update_id]
OPTIONAL_COLUMNS = (  # bucket columns a writer may leave out
    BUCKET.lo,
    BUCKET.hi,
    BUCKET.n_tokens,
    BUCKET.update_id,
    BUCKET.grad_norm,
    BUCKET.update_share,
    BUCKET.cos_to_total,
    BUCKET.dprob_mean,
    BUCKET.correct_ratio,
)


def with_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Optional columns that were never written added as NaN (update_id as 0: one update a step)."""
    missing = [c for c in OPTIONAL_COLUMNS if c not in df.columns]
    return df.assign(**{c: (0 if c == BUCKET.update_id else np.nan) for c in missing}) if missing else df


def analysed_updates(
    buckets: pd.DataFrame, step_range: tuple[int, int] | None = None, update_id: int | None = None
) -> pd.DataFrame:
    """[step, rank, update_id, live, empty] of every update in the selection that a bucket pass analysed
    (some bucket's grad_norm recorded); live = some bucket's gradient norm is > 0 (else the update had
    no gradient and its shares are undefined); empty = no loss token fell in any bucket (a Lopti phase
    that no token reached). An attribution step without a bucket pass writes bucket rows too, its tokens'
    update shares summed per bucket (tokengrad.record.attribution.step.bucket_share_rows) but no norms:
    those updates are not analysed here, as the figures leave them out."""
    cols = [*UPDATE_KEYS, "live", "empty"]
    df = with_columns(buckets)
    if step_range is not None:
        df = df[df[BUCKET.step].between(*step_range)]
    if update_id is not None:
        df = df[df[BUCKET.update_id] == update_id]
    if df.empty:
        return pd.DataFrame(columns=cols)
    norms = pd.to_numeric(df[BUCKET.grad_norm], errors="coerce")
    tokens = pd.to_numeric(df[BUCKET.n_tokens], errors="coerce")
    by = [df[k] for k in UPDATE_KEYS]
    out = pd.DataFrame(
        {
            "analysed": norms.notna().groupby(by).any(),
            "live": norms.fillna(0).gt(0).groupby(by).any(),
            "empty": tokens.groupby(by).sum(min_count=1).eq(0),  # unknown counts: not empty
        }
    )
    return out[out["analysed"]].drop(columns="analysed").reset_index()[cols]


def analysis_note(updates: pd.DataFrame) -> str:
    """Which analysed updates a bucket figure averages: '3 of 8 analysed updates had a gradient (steps
    20, 40; updates 0, 1)'. Updates without loss tokens (an empty Lopti phase) are not counted, and
    said so. An empty selection says why."""
    if updates.empty:
        return "no bucket analysis in the selection"
    empty = updates["empty"] if "empty" in updates else pd.Series(False, index=updates.index)
    counted, n_empty = updates[~empty.astype(bool)], int(empty.sum())
    left = (
        f"; {n_empty} update{'s' if n_empty > 1 else ''} without loss tokens not counted" if n_empty else ""
    )
    live = counted[counted["live"].astype(bool)]
    if live.empty:
        n_steps = updates[BUCKET.step].nunique()
        noun = "step" if n_steps == 1 else "steps"
        why = "every advantage was 0" if not n_empty else "no loss tokens, or every advantage was 0"
        return f"all {n_steps} analysed {noun} had no gradient ({why})"
    at = sorted(int(s) for s in live[BUCKET.step].unique())
    listed = f"step{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}"
    steps = listed if len(at) <= 6 else f"{len(at)} steps from {at[0]} to {at[-1]}"
    ups = ", ".join(str(int(u)) for u in sorted(live[BUCKET.update_id].unique()))
    return (
        f"{len(live)} of {len(counted)} analysed updates had a gradient ({steps}; "
        f"update{'s' if ',' in ups else ''} {ups}){left}"
    )


def live_rows(
    buckets: pd.DataFrame, step_range: tuple[int, int] | None = None, update_id: int | None = None
) -> pd.DataFrame:
    """The bucket rows of the analysed updates with a gradient in the selection."""
    updates = analysed_updates(buckets, step_range, update_id)
    keep = updates.loc[updates["live"], UPDATE_KEYS]
    return with_columns(buckets).merge(keep, on=UPDATE_KEYS, how="inner")


def live_step_rows(
    buckets: pd.DataFrame, step_range: tuple[int, int] | None = None, update_id: int | None = None
) -> pd.DataFrame:
    """The bucket rows of every analysed update of the steps (per rank) with a gradient in the selection:
    the probability change after a step sits on its last update's rows (record.step_buckets), which may be
    an update without loss tokens (Lopti's second phase when no token reached it)."""
    updates = analysed_updates(buckets, step_range, update_id)
    live = updates.groupby([BUCKET.step, BUCKET.rank])["live"].transform("any").astype(bool)
    keep = updates.loc[live, UPDATE_KEYS]
    return with_columns(buckets).merge(keep, on=UPDATE_KEYS, how="inner")
