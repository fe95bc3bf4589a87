"""The headline quantities, defined once: which share of the loss tokens the low-probability tokens are,
and which share of the update they make (the AR-Lopti premise, arXiv 2505.12929 Fig. 1). The dashboard,
`tokengrad export`, the README and docs/study.md all take them from here.

    low_prob_shares(run, step_range=(0, 199))     # -> Headline(token_share=0.062, update_share=0.656, ...)
    pooled_bucket_shares(run.buckets)             # every bucket's pooled token and update share
    pooled_step_shares(run.buckets)               # step x bucket: a step's combined update (Lopti: 2 phases)

Definition. The bucket analysis records, for every analysed update u and probability bucket B, the
bucket's share of that update s_{B,u} = <g_{B,u}, g_u> / |g_u|^2 (the buckets and the residual sum to 1)
and its loss tokens n_{B,u}. Over a set U of updates (a step range; one step's Lopti phases; one phase)

    share of the update  = sum_u <g_{B,u}, g_u> / sum_u |g_u|^2 = sum_u s_{B,u} |g_u|^2 / sum_u |g_u|^2
    share of the tokens  = sum_u n_{B,u} / sum_u n_u

i.e. the bucket's part of the summed squared update norm, so that an update counts by its size (a spike
counts more than a step with almost no gradient) and the shares of all buckets still sum to 1. For one
step of Lopti, whose two phases each sum to 1, this is the step's combined update. Only updates with a
gradient count (|g_u| > 0); each loss token counts in the update that trained it.

|g_u| comes from the bucket rows themselves: since the buckets' gradients sum to g_u,
sum_B |g_{B,u}| cos(g_{B,u}, g_u) = |g_u|, with the buckets whose cosine was not recorded (the residual)
entering through their share: |g_u| = sum_{B: cos known} |g_B| cos_B / (1 - sum_{B: cos unknown} s_B).
The layers table's pre-clip total is the fallback where that is undefined.

"Low probability" is p < 0.25 (AR-Lopti's first quarter): the buckets whose upper edge is at most
`threshold`; when no bucket edge falls on it, the largest edge below it (or the first bucket's upper edge)
is used and reported as `Headline.below`. Without a bucket analysis the update share is undefined (NaN)
and the token share is taken over the live steps of the token table (tokengrad.read.gradient_shares).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from tokengrad.schema import BIN, BUCKET, LAYER, RESIDUAL_BUCKET, TOTAL_LAYER

LOW_PROB = 0.25  # AR-Lopti's low-probability quarter
_TOL = 1e-6  # bucket edges are float32
_UPDATE = [BUCKET.step, BUCKET.update_id]
TOKEN_SHARE_NAME = "share of loss tokens"
UPDATE_SHARE_NAME = "share of the update"
DEFINITION = (
    "share of the update = Σ over the analysed updates of ⟨g_B, g⟩ / Σ of |g|² (each update counts by "
    "its squared size; a Lopti step's two phases combine into the step's update); share of loss tokens = "
    "the bucket's loss tokens over all loss tokens of the same updates"
)


def low_prob_label(below: float = LOW_PROB) -> str:
    """'p < 0.25': the low-probability tokens, in words on every chart and table that shows them."""
    return f"p < {below:g}"


@dataclass(frozen=True, kw_only=True)
class Headline:
    token_share: float  # share of the loss tokens with p < below
    update_share: float  # share of the update those tokens made (NaN without a bucket analysis)
    below: float  # the probability edge actually used
    n_updates: int  # analysed updates with a gradient that were pooled
    steps: tuple[int, ...]  # their steps
    source: str  # "bucket analysis", or "token table" (no bucket analysis: token share only)


def update_norms(buckets: pd.DataFrame, layers: pd.DataFrame | None = None) -> pd.Series:
    """|g_u| per (step, update_id) from the bucket rows (module doc), the layers total where undefined."""
    b = buckets
    share = pd.to_numeric(b[BUCKET.update_share], errors="coerce").fillna(0.0)
    cos = pd.to_numeric(b[BUCKET.cos_to_total], errors="coerce")
    norm = pd.to_numeric(b[BUCKET.grad_norm], errors="coerce").fillna(0.0)
    parts = pd.DataFrame(
        {
            "ip": (norm * cos).where(cos.notna(), 0.0),
            "rest": share.where(cos.isna(), 0.0),
            BUCKET.step: b[BUCKET.step].to_numpy(),
            BUCKET.update_id: b[BUCKET.update_id].to_numpy(),
            BUCKET.rank: b[BUCKET.rank].to_numpy(),
        }
    )
    per = parts.groupby([BUCKET.rank, *_UPDATE])[["ip", "rest"]].sum()
    g = (per["ip"] / (1.0 - per["rest"])).groupby(level=_UPDATE).mean()  # ranks share the all-reduced g
    if layers is not None and not layers.empty and LAYER.layer in layers:
        total = layers[layers[LAYER.layer] == TOTAL_LAYER].groupby(_UPDATE)[LAYER.grad_norm].max()
        bad = ~(np.isfinite(g) & (g > 0))
        g[bad] = total.reindex(g.index[bad]).to_numpy()
    return g.astype(float)


def _selected(buckets: pd.DataFrame, step_range, update_id) -> pd.DataFrame:
    b = buckets
    if BUCKET.update_id not in b:
        b = b.assign(**{BUCKET.update_id: 0})
    if step_range is not None:
        b = b[b[BUCKET.step].between(*step_range)]
    if update_id is not None:
        b = b[b[BUCKET.update_id] == update_id]
    return b


def _pooled(b: pd.DataFrame, g2: pd.Series, by: list[str]) -> pd.DataFrame:
    """Per `by` + bucket: summed tokens and the squared-norm-weighted update share (module doc)."""
    b = b.assign(
        _all=0,
        _n=pd.to_numeric(b[BUCKET.n_tokens], errors="coerce").fillna(0),
        _s=pd.to_numeric(b[BUCKET.update_share], errors="coerce").fillna(0),
    )
    by = by or ["_all"]
    # ranks hold the same all-reduced shares: one weight per update, tokens summed over ranks
    first = {c: (c, "first") for c in (BUCKET.lo, BUCKET.hi, *[k for k in by if k not in _UPDATE])}
    per = b.groupby([*_UPDATE, BUCKET.bucket]).agg(**first, n=("_n", "sum"), s=("_s", "mean")).reset_index()
    per["w"] = g2.reindex(pd.MultiIndex.from_frame(per[_UPDATE])).to_numpy()  # |g_u|^2
    per["sw"] = per["s"] * per["w"]
    out = per.groupby([*by, BUCKET.bucket]).agg(
        **{BUCKET.lo: (BUCKET.lo, "first"), BUCKET.hi: (BUCKET.hi, "first")}, n=("n", "sum"), sw=("sw", "sum")
    )
    out = out.reset_index()
    weight = per.drop_duplicates(_UPDATE).groupby(by)["w"].sum()  # sum_u |g_u|^2 per group
    prob = out[BUCKET.bucket] != RESIDUAL_BUCKET
    n_all = out[prob].groupby(by)["n"].sum()
    key = pd.MultiIndex.from_frame(out[by]) if len(by) > 1 else pd.Index(out[by[0]])
    out[BUCKET.n_tokens] = out.pop("n").where(prob)
    out[BUCKET.token_share] = (out[BUCKET.n_tokens] / n_all.reindex(key).to_numpy()).where(prob)
    out[BUCKET.update_share] = out.pop("sw") / weight.reindex(key).to_numpy()
    return out.drop(columns="_all", errors="ignore")


def live_updates(buckets: pd.DataFrame, layers: pd.DataFrame | None = None) -> pd.Series:
    """The pooling weight |g_u|^2 of the analysed updates with a gradient, indexed by (step, update_id).

    A table without the norms (no cos_to_total, no layers total) weighs its updates with a gradient
    (some bucket norm > 0) equally; attrs["weights"] says which: "|g|²" or "equal"."""
    if buckets.empty:
        return pd.Series(dtype=float)
    b = buckets.assign(**{c: np.nan for c in (BUCKET.cos_to_total, BUCKET.grad_norm) if c not in buckets})
    g = update_norms(b, layers)
    known = np.isfinite(g) & (g > 0)
    if known.any():
        out = (g[known] ** 2).rename("g2")
        out.attrs["weights"] = "|g|²"
        return out
    norms = pd.to_numeric(b[BUCKET.grad_norm], errors="coerce").fillna(0)
    live = norms.gt(0).groupby([b[k] for k in _UPDATE]).any()
    out = pd.Series(1.0, index=live[live].index, name="g2")
    out.attrs["weights"] = "equal"
    return out


def _order(df: pd.DataFrame) -> pd.DataFrame:
    res = df[BUCKET.bucket].eq(RESIDUAL_BUCKET).astype(int)
    return df.assign(_r=res).sort_values(["_r", BUCKET.lo], kind="stable").drop(columns="_r")


def pooled_bucket_shares(
    buckets: pd.DataFrame,
    step_range: tuple[int, int] | None = None,
    update_id: int | None = None,
    layers: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """[bucket, lo, hi, n_tokens, token_share, update_share] over the analysed updates with a gradient in
    the selection (module doc), probability buckets by lower edge, the residual last. attrs: n_updates,
    steps (those pooled)."""
    b = _selected(buckets, step_range, update_id)
    g2 = live_updates(b, layers) if not b.empty else pd.Series(dtype=float)
    cols = [BUCKET.bucket, BUCKET.lo, BUCKET.hi, BUCKET.n_tokens, BUCKET.token_share, BUCKET.update_share]
    if g2.empty:
        out = pd.DataFrame(columns=cols)
    else:
        b = b.set_index(_UPDATE).loc[lambda d: d.index.isin(g2.index)].reset_index()
        out = _order(_pooled(b, g2, []))[cols].reset_index(drop=True)
    out.attrs.update(
        n_updates=int(len(g2)),
        steps=tuple(sorted({int(s) for s in g2.index.get_level_values(0)})),
        weights=g2.attrs.get("weights", "|g|²"),
    )
    return out


def pooled_step_shares(
    buckets: pd.DataFrame, value: str = BUCKET.update_share, update_id: int | None = None
) -> pd.DataFrame:
    """step x bucket of `value` (update_share or token_share) pooled over the step's updates with a
    gradient: with update_id=None a Lopti step shows its combined update, which sums to 1."""
    b = _selected(buckets, None, update_id)
    g2 = live_updates(b) if not b.empty else pd.Series(dtype=float)
    if g2.empty:
        return pd.DataFrame()
    b = b.set_index(_UPDATE).loc[lambda d: d.index.isin(g2.index)].reset_index()
    per = _order(_pooled(b, g2, [BUCKET.step]))
    order = list(dict.fromkeys(per[BUCKET.bucket]))
    return per.pivot_table(index=BUCKET.step, columns=BUCKET.bucket, values=value, aggfunc="first").reindex(
        columns=order
    )


def _low_edge(buckets: pd.DataFrame, threshold: float) -> float:
    his = sorted(
        {float(h) for h in buckets.loc[buckets[BUCKET.bucket] != RESIDUAL_BUCKET, BUCKET.hi].dropna()}
    )
    below = [h for h in his if h <= threshold + _TOL]
    return round(below[-1] if below else his[0], 6)


def low_prob_shares(
    run,
    step_range: tuple[int, int] | None = None,
    *,
    threshold: float = LOW_PROB,
    update_id: int | None = None,
    shares: pd.DataFrame | None = None,
) -> Headline:
    """The low-probability tokens' share of the loss tokens and of the update over `step_range` (module
    doc: the one definition every view uses). `run`: a tokengrad.read.Run (buckets, layers, sql).
    `shares`: pooled_bucket_shares(run.buckets, step_range, update_id, run.layers), when the caller has
    it already (the dashboard pools each run once)."""
    buckets = run.buckets
    if not buckets.empty:
        if shares is None:
            shares = pooled_bucket_shares(buckets, step_range, update_id, run.layers)
        below = _low_edge(buckets, threshold)
        low = shares[(shares[BUCKET.bucket] != RESIDUAL_BUCKET) & (shares[BUCKET.hi] <= below + _TOL)]
        if shares.attrs["n_updates"]:
            return Headline(
                token_share=float(low[BUCKET.token_share].sum()),
                update_share=float(low[BUCKET.update_share].sum()),
                below=below,
                n_updates=shares.attrs["n_updates"],
                steps=shares.attrs["steps"],
                source="bucket analysis",
            )
    return _token_table_share(run, step_range, threshold)


def _token_table_share(run, step_range, threshold: float) -> Headline:
    from tokengrad.read.gradient_shares import gradient_by_bucket

    try:
        t = gradient_by_bucket(run, (0.0, threshold, 1.0), step_range=step_range)
    except Exception:  # noqa: BLE001 - no token table (or none readable): nothing to share
        return Headline(
            token_share=np.nan, update_share=np.nan, below=threshold, n_updates=0, steps=(), source="none"
        )
    token = float(t["token_share"].iloc[0]) if t[BIN.count].sum() else np.nan
    steps = tuple(t.attrs.get("steps", ()))
    return Headline(
        token_share=token,
        update_share=np.nan,
        below=threshold,
        n_updates=0,
        steps=steps,
        source="token table",
    )
