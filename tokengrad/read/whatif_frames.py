"""The `whatif` table next to the actual update: per step the actual pre-clip gradient norm beside each
rule's (on the same parameters and batch), the rules' probability-bucket shares beside the actual ones (the
`buckets` table), and one step's comparison in numbers. pandas only; the figures and the doctor read these.

    norms = norm_trajectories(run.table("whatif"), run.layers)       # step, series, grad_norm, cos_to_actual
    shares = bucket_share_table(run.table("whatif"), run.buckets)   # series, bucket, lo, update_share
    step_comparison(run.table("whatif"), run.layers, run.buckets, step=41)
"""

from __future__ import annotations

import math

import pandas as pd

from tokengrad.schema import BUCKET, LAYER, RESIDUAL_BUCKET, TOTAL_LAYER, WHAT, WHATIF_ALL

ACTUAL = "actual"  # the series name of the update the run made


def _first_phase(whatif: pd.DataFrame) -> pd.DataFrame:
    """Rows of each rule's first phase (Lopti's second phase is a row set of its own, `phase` 1)."""
    return whatif[whatif[WHAT.phase] == 0]


def norm_trajectories(whatif: pd.DataFrame, layers: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, series) on the steps with what-if rows: the actual update's largest pre-clip norm
    of the step (series 'actual') and each rule's, with its cosine to the actual gradient."""
    cols = ["step", "series", "grad_norm", "cos_to_actual", "would_clip"]
    if whatif.empty:
        return pd.DataFrame(columns=cols)
    alls = _first_phase(whatif[whatif[WHAT.bucket] == WHATIF_ALL])
    # the update of the step's largest actual norm, as steps.grad_norm (the max over the step's updates)
    total = layers[layers[LAYER.layer] == TOTAL_LAYER]
    total = total[total[LAYER.rank] == total[LAYER.rank].min()]
    actual = total.loc[total.groupby(LAYER.step)[LAYER.grad_norm].idxmax()]
    actual = actual[actual[LAYER.step].isin(alls[WHAT.step])]
    keyed = alls.merge(actual[[LAYER.step, LAYER.update_id]], on=[WHAT.step, WHAT.update_id])
    rules = keyed.assign(series=keyed[WHAT.rule])[cols]
    act = actual.assign(series=ACTUAL, cos_to_actual=1.0, would_clip=None)[
        ["step", "series", LAYER.grad_norm, "cos_to_actual", "would_clip"]
    ]
    return pd.concat([act, rules], ignore_index=True).sort_values(["series", "step"], kind="stable")


def bucket_share_table(
    whatif: pd.DataFrame, buckets: pd.DataFrame, steps: tuple[int, int] | None = None
) -> pd.DataFrame:
    """Mean update share per probability bucket over the steps with what-if rows (within `steps`): the
    actual update's (the `buckets` table, where the bucket analysis ran on those steps) and each rule's."""
    cols = ["series", "bucket", "lo", "update_share", "n_steps"]
    rows = whatif[(whatif[WHAT.bucket] != WHATIF_ALL) & (whatif[WHAT.rank] == whatif[WHAT.rank].min())]
    rows = _first_phase(rows)
    if steps is not None:
        rows = rows[rows[WHAT.step].between(*steps)]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    rule = rows.groupby([WHAT.rule, WHAT.bucket, WHAT.lo], as_index=False).agg(
        update_share=(WHAT.update_share, "mean"), n_steps=(WHAT.step, "nunique")
    )
    rule = rule.rename(columns={WHAT.rule: "series"})
    b = buckets[(buckets[BUCKET.bucket] != RESIDUAL_BUCKET) & buckets[BUCKET.step].isin(rows[WHAT.step])]
    b = b[b[BUCKET.rank] == b[BUCKET.rank].min()] if not b.empty else b
    act = b.groupby([BUCKET.bucket, BUCKET.lo], as_index=False).agg(
        update_share=(BUCKET.update_share, "mean"), n_steps=(BUCKET.step, "nunique")
    )
    act.insert(0, "series", ACTUAL)
    return pd.concat([act, rule], ignore_index=True)[cols].sort_values(["series", "lo"], kind="stable")


def step_comparison(
    whatif: pd.DataFrame, layers: pd.DataFrame, buckets: pd.DataFrame, *, step: int, below: float = 0.25
) -> list[dict]:
    """For each rule with rows at `step`: {rule, norm, actual_norm, low_share, actual_low_share, cos}, the
    low shares the summed update share of the buckets below `below` (NaN where not recorded)."""
    norms = norm_trajectories(whatif[whatif[WHAT.step] == step], layers)
    shares = bucket_share_table(whatif, buckets, (step, step))
    low = shares[shares["lo"] < below - 1e-9].groupby("series")["update_share"].sum(min_count=1)
    actual = norms[norms.series == ACTUAL]
    if actual.empty:
        return []
    out = []
    for _, r in norms[norms.series != ACTUAL].iterrows():
        out.append(
            dict(
                rule=r.series,
                norm=float(r.grad_norm),
                actual_norm=float(actual.grad_norm.iloc[0]),
                low_share=float(low.get(r.series, math.nan)),
                actual_low_share=float(low.get(ACTUAL, math.nan)),
                cos=float(r.cos_to_actual),
            )
        )
    return out
