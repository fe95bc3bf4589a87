"""Probability buckets: which probability range of tokens makes the update (AR-Lopti arXiv 2505.12929
Fig. 1). First the run-wide answer from the token table (every run with tokens), then the recorded bucket
analysis (runs recorded with buckets=N), then per-token norms against probability and the rules' weight
curves."""

from __future__ import annotations

import numpy as np
import streamlit as st

from tokengrad.app import data
from tokengrad.app.views import common, hints
from tokengrad.figures.buckets import (
    BUCKET_LABELS,
    RESIDUAL_HELP,
    make_bucket_dprob_figure,
    make_bucket_grad_norm_figure,
    make_bucket_share_figure,
    make_bucket_steps_figure,
    make_weight_curve_figure,
)
from tokengrad.figures.probability import (
    make_grad_vs_prob_figure,
    make_gradient_share_figure,
    make_partition_share_figure,
    make_prob_histogram_figure,
    scope_note,
    with_update_shares,
)
from tokengrad.read import meta_file
from tokengrad.read.headline import DEFINITION, low_prob_label
from tokengrad.read.queries import ABS_COEF
from tokengrad.read.share_queries import PARTITIONS
from tokengrad.schema import BIN, BUCKET, DECILE_BUCKET_EDGES, DEFAULT_BUCKET_EDGES, TOK

OVER_STEPS = (BUCKET.update_share, BUCKET.grad_norm, BUCKET.token_share, BUCKET.cos_to_total)
EDGES = {"quarters": DEFAULT_BUCKET_EDGES, "tenths": DECILE_BUCKET_EDGES}
GRAD_VALUES = {  # per-token norm -> how the (1 - p) references are scaled (see make_grad_vs_prob_figure)
    TOK.logit_grad_unit: "exact bounds: |d(-log p)/dlogits| per unit coef",
    TOK.logit_grad_norm: "references scaled by the mean |coef|: a guide, not a bound",
}


def _headline(run: str, step_range: tuple[int, int] | None) -> None:
    """Each bucket's share of the loss tokens, of the update (bucket analysis: the headline definition)
    and of the summed per-token gradient norm, run-wide, live steps only."""
    name = common.run_name(run)
    if not data.has_table(run, "tokens"):
        common.empty(f"No token table in {name}.", hints.hint(data.meta(run), "tokens"))
        return
    edges = st.radio("Buckets", list(EDGES), horizontal=True, key="bk_edges")
    shares = data.query(run, "gradient_by_bucket", edges=list(EDGES[edges]), step_range=step_range)
    buckets = data.table(run, "buckets")
    pooled = data.pooled_shares(run, step_range) if len(buckets) else None
    shares = with_update_shares(shares, pooled)
    note = scope_note(shares.attrs.get("n_live", 0), shares.attrs.get("n_steps", 0), step_range)
    common.chart(
        make_gradient_share_figure(
            shares, title=f"Which tokens make the update: {name}<br><sup>{note}</sup>"
        ),
        "bk_headline",
        f"gradient_share_{name}",
        table=shares,
    )
    head = data.low_prob_shares(run, step_range)
    said = {
        "bucket analysis": f"share of the update from the bucket analysis ({DEFINITION})",
        "per-token attribution": "share of the update: Σ update_share of the attributed updates",
        "none": "no share of the update: "
        + (
            hints.hint(data.meta(run), "buckets")
            if buckets.empty
            else "the bucket analysis has other buckets; pick them above"
        ),
    }[shares.attrs["update_from"]]
    headline_words = (
        f"Tokens with {low_prob_label(head.below)}: {head.token_share:.1%} of the loss tokens, "
        f"{head.update_share:.1%} of the update. "
        if np.isfinite(head.update_share)
        else ""
    )
    st.caption(
        f"{headline_words}Shown: {said}; a loss token's gradient norm is |coef| · |p − e_y| at the logits "
        "(logit_grad_norm), summed per bucket over the live steps (steps whose every advantage is 0 have "
        "no gradient). The summed gradient norm is not the update: tokens' gradients cancel and align."
    )


def _phase_options(run: str, buckets) -> dict:
    """None (all updates) and each recorded update id, labelled (Lopti: which phase trains which tokens)."""
    ids = sorted(int(u) for u in buckets[BUCKET.update_id].dropna().unique())
    if len(ids) <= 1:
        return {None: "all updates"}
    low_first = meta_file.lopti_low_first(data.meta(run))
    names = {0: "low-probability tokens", 1: "high-probability tokens"}
    if low_first is False:
        names = {0: names[1], 1: names[0]}
    out = {None: "all updates (the step's combined update)"}
    for u in ids:
        lopti = low_first is not None and u in names
        out[u] = f"update {u}" + (f" (Lopti phase {u + 1}: {names[u]})" if lopti else "")
    return out


def _bucket_sections(run: str, step_range: tuple[int, int] | None) -> None:
    buckets = data.table(run, "buckets")
    name = common.run_name(run)
    if buckets.empty:
        common.empty(f"No bucket analysis in {name}.", hints.hint(data.meta(run), "buckets"))
        return
    phases = _phase_options(run, buckets)
    update_id = None
    if len(phases) > 1:
        update_id = st.radio(
            "Updates",
            list(phases),
            format_func=phases.get,
            horizontal=True,
            key="bk_update",
            help="Token and update shares always come from the same updates.",
        )
    kw = dict(update_id=update_id)
    c1, c2 = st.columns(2)
    with c1:
        common.chart(
            make_bucket_share_figure(buckets, step_range, title="Token share vs update share", **kw),
            "bk_share",
            f"bucket_shares_{name}",
        )
    with c2:
        common.chart(
            make_bucket_grad_norm_figure(buckets, step_range, title="Bucket gradient norm", **kw),
            "bk_norm",
            f"bucket_grad_norm_{name}",
        )
    combined = (
        " A step's updates combine as Σ_u ⟨g_B,u, g_u⟩ / Σ_u |g_u|² (each phase's shares sum to 1; "
        "the combination sums to 1 too)."
        if update_id is None and len(phases) > 1
        else ""
    )
    st.caption(f"{phases[update_id]}; {RESIDUAL_HELP}.{combined} {DEFINITION}.")
    value = st.selectbox("Over steps", OVER_STEPS, format_func=BUCKET_LABELS.get, key="bk_value")
    shown = buckets if step_range is None else buckets[buckets[BUCKET.step].between(*step_range)]
    common.chart(make_bucket_steps_figure(shown, value, **kw), "bk_steps", f"bucket_{value}_{name}")
    common.chart(
        make_bucket_dprob_figure(buckets, step_range, title="Probability change after the update", **kw),
        "bk_dprob",
        f"bucket_dprob_{name}",
    )


PARTITION_NAMES = {
    "prob": "probability",
    "entropy_quantile": "entropy quantile",
    "adv_sign": "advantage sign",
    "position": "position",
}


def _partition_section(run: str, step_range: tuple[int, int] | None) -> None:
    """Share of the update by any partition of the tokens: a sum of per-token update_share."""
    name = common.run_name(run)
    if not data.has_table(run, "tokens"):
        common.empty(f"No token table in {name}.", hints.hint(data.meta(run), "tokens"))
        return
    if not data.query(run, "attributed_steps"):
        common.empty(f"No per-token attribution in {name}.", hints.hint(data.meta(run), "attribution"))
        return
    c1, c2 = st.columns([2, 1])
    by = c1.radio(
        "Partition tokens by",
        list(PARTITIONS),
        format_func=PARTITION_NAMES.get,
        horizontal=True,
        key="bk_partition",
    )
    bins = c2.slider("Parts", 2, 20, 5, key="bk_parts", disabled=by == "adv_sign")
    shares = data.query(run, "share_by_partition", by=by, bins=bins, step_range=step_range)
    title = f"Share of the update by {PARTITION_NAMES[by]}"
    common.chart(
        make_partition_share_figure(shares, by, title=title),
        "bk_partition_chart",
        f"update_share_by_{by}_{name}",
        table=shares,
    )
    st.caption(
        "A part's share of the update is the sum of its tokens' update_share "
        "(coef · ⟨∇log π, g⟩ / ‖g‖²) per attributed update; the parts and the residual sum to 1."
    )


def _token_sections(run: str, step_range: tuple[int, int] | None) -> None:
    name = common.run_name(run)
    if not data.has_table(run, "tokens"):
        common.empty(f"No token table in {name}.", hints.hint(data.meta(run), "tokens"))
        return
    c1, c2 = st.columns([1, 2])
    bins = c1.slider("Probability bins", 5, 50, 20, 5, key="bk_bins")
    value = c2.radio(
        "Per-token gradient norm",
        list(GRAD_VALUES),
        horizontal=True,
        key="bk_grad",
        captions=list(GRAD_VALUES.values()),
    )
    # One scan of the token table serves both charts: the binned means carry the per-bin counts.
    binned = data.query(run, "grad_norm_by_prob", bins=bins, step_range=step_range)
    c1, c2 = st.columns(2)
    with c1:
        common.chart(
            make_prob_histogram_figure(binned[[BIN.lo, BIN.hi, BIN.count]], title="Token probabilities"),
            "bk_hist",
            f"prob_hist_{name}",
        )
    with c2:
        scale = _coef_scale(binned) if value == TOK.logit_grad_norm else 1.0
        common.chart(
            make_grad_vs_prob_figure(binned, value, ref_scale=scale, title="Gradient norm vs probability"),
            "bk_gvp",
            f"grad_vs_prob_{name}",
        )


def _coef_scale(binned) -> float:
    """Token-weighted mean |coef| over the bins (the factor between logit_grad_norm and its unit)."""
    ok = binned[ABS_COEF].notna() & (binned[BIN.count] > 0)
    total = binned.loc[ok, BIN.count].sum()
    return float((binned.loc[ok, ABS_COEF] * binned.loc[ok, BIN.count]).sum() / total) if total else 1.0


def render() -> None:
    st.title("Probability buckets")
    runs = common.require_runs()
    run = common.pick_one(runs, "bk_run")
    step_range = common.step_range_ui(run, "bk_steps_range")
    st.subheader("Which tokens carry the gradient")
    with common.guard("Gradient by probability"):
        _headline(run, step_range)
    st.subheader("Bucket analysis (recorded every N steps, buckets=N)")
    with common.guard("Bucket analysis"):
        _bucket_sections(run, step_range)
    st.subheader("Share of the update by partition (per-token attribution)")
    with common.guard("Update share by partition"):
        _partition_section(run, step_range)
    st.subheader("Per-token gradient norm by probability")
    with common.guard("Token probabilities"):
        _token_sections(run, step_range)
    st.subheader("Weight curve w(p) of the rules")
    with common.guard("Weight curves"):
        metas = {common.run_name(r): data.meta(r) for r in runs}
        common.chart(make_weight_curve_figure(metas, colors=common.colors()), "bk_wp", "weight_curves")
    common.show_run_warnings(runs)


render()
