"""The bucket analysis of one optimizer update, from its accumulated bucket gradients to `buckets` rows.

A step's passes add their bucket gradients g_B into one `BucketState` per update (bucket_analysis.py
computes them); when the update's full gradient g is known, `bucket_rows` turns the state into one row per
bucket (share of tokens, |g_B|, update share <g_B, g>/|g|^2, cosine; AR-Lopti arXiv 2505.12929, Fig. 1) and
the residual row. Under DDP the bucket gradients are averaged over ranks first, as DDP averages g.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tokengrad import schema
from tokengrad.record.buckets import analysis as bk


@dataclass
class BucketState:
    grads: list  # per bucket: per-parameter grads (None: no token yet)
    n_tokens: list[int] = field(default_factory=list)
    derived: int | None = None  # the bucket taken as g minus the others (bucket_analysis.bucket_shares)
    derived_lost: bool = False  # a later pass was not residual-free: the derived bucket is unknown


def all_reduce_mean(state: BucketState, like: list[torch.Tensor]) -> None:
    """Match DDP's gradient averaging so bucket gradients compare with the global gradient; token counts
    are summed. Every rank takes part for every bucket (an empty one with zeros) so the collectives match."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    ws = dist.get_world_size()
    for b, g in enumerate(state.grads):
        if g is None:
            g = state.grads[b] = [torch.zeros_like(t) for t in like]
        for t in g:
            dist.all_reduce(t)
            t.div_(ws)
    counts = torch.tensor(state.n_tokens, dtype=torch.long, device=like[0].device if like else "cpu")
    dist.all_reduce(counts)
    state.n_tokens = counts.tolist()


def bucket_rows(
    state: BucketState,
    total: list[torch.Tensor],
    edges: tuple[float, ...],
    *,
    step: int,
    rank: int,
    update_id: int,
) -> list[dict]:
    """One `buckets` row per probability bucket and the residual row, for the update whose full gradient
    is `total` (per parameter, before clipping)."""
    all_reduce_mean(state, total)
    res = bk.bucket_shares(state.grads, total, derived=state.derived)
    if state.derived_lost:  # g holds a residual the derived bucket cannot be told from
        d = state.derived
        res["grad_norm"][d] = res["update_share"][d] = res["cos_to_total"][d] = math.nan
        res["residual_grad_norm"] = res["residual_share"] = math.nan
    return figure_rows(res, state.n_tokens, edges, step=step, rank=rank, update_id=update_id)


def figure_rows(
    res: dict, n_tokens: list[int], edges: tuple[float, ...], *, step: int, rank: int, update_id: int
) -> list[dict]:
    """The `buckets` rows of one update from its figures (bucket_analysis.figures) and token counts."""
    n_all = max(sum(n_tokens), 1)
    key = dict(step=step, rank=rank, update_id=update_id)
    rows = [
        dict(
            key,
            bucket=schema.bucket_label(lo, hi),
            lo=lo,
            hi=hi,
            n_tokens=n_tokens[b],
            token_share=n_tokens[b] / n_all,
            grad_norm=res["grad_norm"][b],
            update_share=res["update_share"][b],
            cos_to_total=res["cos_to_total"][b],
        )
        for b, (lo, hi) in enumerate(zip(edges, edges[1:]))
    ]
    rows.append(
        dict(
            key,
            bucket=schema.RESIDUAL_BUCKET,
            grad_norm=res["residual_grad_norm"],
            update_share=res["residual_share"],
        )
    )
    return rows
