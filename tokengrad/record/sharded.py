"""The bucket analysis where each rank holds only a shard of the gradient (FSDP2 `fully_shard`, FSDP1),
streamed to scalars: exact, and never an unsharded gradient.

With g the update's full gradient and g_B the gradient of sum_{t in B} coef_t log pi_t (bucket_analysis.py,
AR-Lopti arXiv 2505.12929, Fig. 1), a bucket row needs |g_B|, <g_B, g> and |g|, and the residual row
|g - sum_B g_B|. Each is a sum over parameter elements, so it is the sum over ranks of the same sum over
each rank's shard: per rank partial sums, then one all-reduce of 2K + 2 scalars.

The bucket gradients come from the wrapper itself: one backward of the tracked log-probs per bucket with
grad_output coef * [t in B], through the retained graph, at `record_grad_norms` time. FSDP then
reduce-scatters g_B exactly as it reduced g (the same averaging over ranks, the same mixed-precision
reduce dtype), so rank r's `.grad` holds shard r of g_B. Memory per rank, whatever K: the shard of g saved
aside and the shard of the running residual g - sum_B g_B (two buffers the size of the rank's gradient
shard); `.grad` itself holds one g_B at a time and is g again afterwards, bit for bit.

Every rank must run the same passes (each runs FSDP's collectives): the buckets are the union of the
ranks' active ones, agreed on first (record/agreement.py), and a rank without a tracked pass for the
update stops the analysis on every rank with one line instead of a hang.
"""

from __future__ import annotations

import torch

from tokengrad.record import bucket_analysis as bk
from tokengrad.record import distributed as dist
from tokengrad.record.gradnorms import trainable_params


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: a DTensor's local shard (FSDP2), else the tensor (FSDP1's flat or
    original-parameter shards are plain tensors already)."""
    return t.to_local() if hasattr(t, "to_local") else t


@torch.no_grad()
def _sq(ts: list[torch.Tensor]) -> float:
    """sum of squares over tensors, float64 accumulation of float32 per-tensor norms."""
    ts = [t for t in ts if t.numel()]
    if not ts:
        return 0.0
    norms = torch._foreach_norm([t.float() for t in ts])  # P x []
    return float(torch.stack(norms).double().pow(2).sum())


@torch.no_grad()
def _dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(sum((x.double().reshape(-1) @ y.double().reshape(-1)) for x, y in zip(a, b) if x.numel()))


def rearm_fsdp1(model: torch.nn.Module) -> None:
    """FSDP1 gathers a wrapped module's parameters for the backward only once per forward: its forward
    sets `_needs_pre_backward_unshard` on the module's handle and the pre-backward hook clears it. A
    bucket pass is one more backward through the same forward, so the flag is set again on every FSDP1
    handle, as FSDP1's forward sets it (without it the pass reads freed parameter storage). FSDP2 needs
    nothing: it gathers again on every backward."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    for module in FullyShardedDataParallel.fsdp_modules(model):
        handle = getattr(module, "_handle", None)
        if handle is not None:
            handle._needs_pre_backward_unshard = True


def _bucket_backward(model, passes, bucket: int, last: bool) -> None:
    """One backward of sum_t coef_t [t in bucket] log pi_t over the update's (pass, bucket index [N, T])
    pairs, into `.grad`."""
    for j, (p, idx) in enumerate(passes):
        rearm_fsdp1(model)
        coef = torch.nan_to_num(p.coef.detach())  # [N, T]
        go = coef * ((idx == bucket) & p.in_loss).to(coef.dtype)  # [N, T]
        p.logprobs.backward(go.to(p.logprobs.dtype), retain_graph=not (last and j == len(passes) - 1))


def stream_bucket_figures(passes, model, buckets: list[int], n_buckets: int) -> list:
    """Per-rank partial sums [|g_B|^2 (K) | <g_B, g> (K) | |g|^2 | |g - sum_B g_B|^2] over this rank's
    shard, for the bucket indices `buckets` (the same on every rank), after which `.grad` is g again.
    `passes`: (tracked pass with its graph retained, bucket index [N, T]) pairs."""
    params = [p for _, p in trainable_params(model)]
    had = [p.grad is not None for p in params]
    g = [local_shard(p.grad).detach().clone() for p, h in zip(params, had) if h]  # [shard] buffer 1
    resid = [t.clone() for t in g]  # buffer 2: g - sum_B g_B so far
    part = [0.0] * (2 * n_buckets + 2)
    part[2 * n_buckets] = _sq(g)
    try:
        for i, b in enumerate(buckets):
            for p in params:
                if p.grad is not None:
                    local_shard(p.grad).zero_()  # FSDP accumulates the pass's shard into it
            _bucket_backward(model, passes, b, last=i == len(buckets) - 1)
            gb = [_grad_or_zero(p) for p, h in zip(params, had) if h]
            part[b], part[n_buckets + b] = _sq(gb), _dot(gb, g)
            torch._foreach_sub_(resid, gb)
    finally:
        _restore(params, had, g)
    part[2 * n_buckets + 1] = _sq(resid)
    return part


def _grad_or_zero(p: torch.Tensor) -> torch.Tensor:
    return local_shard(p.grad) if p.grad is not None else torch.zeros_like(local_shard(p))


@torch.no_grad()
def _restore(params, had: list[bool], saved: list[torch.Tensor]) -> None:
    """`.grad` back to g: the saved shard copied in; a parameter without a gradient before gets none."""
    it = iter(saved)
    for p, h in zip(params, had):
        if h:
            local_shard(p.grad).copy_(next(it))
        else:
            p.grad = None


def sharded_bucket_figures(passes, model, *, edges, agreement, step: int) -> tuple[dict, list[int]]:
    """(figures as bucket_shares gives them, token counts per bucket summed over ranks) of one update
    whose gradient is sharded. Every rank calls it (it runs collectives); a rank without a pass of the
    update stops the analysis on every rank with one line (record/agreement.py)."""
    from tokengrad.record.agreement import NO_PASS, READY

    nb = len(edges) - 1
    indexed = [(p, bk.bucket_index(p.tensors["prob"], edges)) for p in passes]  # [N, T] each
    live = [(p, idx) for p, idx in indexed if p.coef is not None and getattr(p.logprobs, "grad_fn", None)]
    mine = [0.0] * nb
    for p, idx in live:
        for b in bk.active_buckets(p.coef, p.in_loss, idx, nb):
            mine[b] = 1.0
    status = READY if live else NO_PASS
    flags = agreement.agree("bucket analysis", step=step, status=status, values=mine)
    active = [b for b in range(nb) if flags[b] > 0]
    part = stream_bucket_figures(live, model, active, nb) if active else _no_pass(model, nb)
    counts = [sum(float(((idx == b) & p.in_loss).sum()) for p, idx in indexed) for b in range(nb)]
    sums = dist.all_reduce(part + counts).tolist()  # the one all-reduce of scalars
    n_tokens = [int(c) for c in sums[2 * nb + 2 :]]
    sq_b = {b: sums[b] for b in active}
    dots = {b: sums[nb + b] for b in active}
    return bk.figures(sq_b, dots, sums[2 * nb], sums[2 * nb + 1], nb), n_tokens


def _no_pass(model, n_buckets: int) -> list:
    """No bucket has a moving token on any rank: every g_B is 0, the residual is g."""
    g = [local_shard(p.grad) for _, p in trainable_params(model) if p.grad is not None]
    part = [0.0] * (2 * n_buckets + 2)
    part[2 * n_buckets] = part[2 * n_buckets + 1] = _sq(g)
    return part
