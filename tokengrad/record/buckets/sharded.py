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
ranks' active ones, agreed on first (record/buckets/agreement.py), and a rank without a tracked pass for the
update stops the analysis on every rank with one line instead of a hang.
"""

from __future__ import annotations

import torch

from tokengrad.record import distributed as dist
from tokengrad.record.buckets import analysis as bk
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


FSDP1_WHY = {
    "bucket analysis": "FullyShardedDataParallel frees the gathered parameters after the first backward, "
    "so the bucket passes cannot run",
    "attribution": "FullyShardedDataParallel has no way to drop gathered parameters, so the forwards at "
    "perturbed shards cannot be told to gather them again",
}


def refusal(model: torch.nn.Module, feature: str) -> str | None:
    """Why `feature` ("bucket analysis" or "attribution") cannot be exact for this model's sharding, in
    one line, or None.

    - FSDP1 (`FullyShardedDataParallel`): see FSDP1_WHY (FSDP2 has neither limit).
    - Tensor parallelism and HSDP place a parameter on a mesh other than FSDP2's one dimension of all
      ranks (or shard it along another dimension): the per-rank partial sums would count replicated
      parts several times, so the sums over ranks are not the figures.
    """
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import Shard

    keep = f"per-token statistics stay exact; set {'buckets' if feature[0] == 'b' else 'attribution'}=0 or"
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return (
            f"tokengrad: {feature} is refused under FSDP1 ({FSDP1_WHY[feature]}); per-block gradient norms "
            f"and {keep} wrap the model with FSDP2 (torch.distributed.fsdp.fully_shard) or DDP"
        )
    for name, p in model.named_parameters():
        mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", None)
        if mesh is None:
            continue
        if mesh.ndim != 1 or mesh.size() != dist.world_size() or tuple(placements) != (Shard(0),):
            return (
                f"tokengrad: {feature} is refused: parameter {name} is placed {tuple(placements)} on a "
                f"{tuple(mesh.shape)} mesh of {dist.world_size()} ranks (tensor parallelism or HSDP), where "
                f"per-rank sums count replicated parts more than once; {keep} shard with FSDP2 over all ranks"
            )
    return None


def refuse_sharding(
    model: torch.nn.Module | None, *, buckets: int = 0, attribution: int = 0, on_spike: bool = False
) -> None:
    """ValueError with `refusal`'s line for the first feature asked for (every > 0) that cannot be exact;
    the spike replay (it takes gradients outside the wrapper) under any sharded gradient."""
    if model is None:
        return
    if on_spike and dist.grads_are_sharded(model):
        raise ValueError(
            "tokengrad: Attribution(on_spike=True) is refused under sharded (FSDP) gradients (the replay "
            "without the culprit tokens takes the full gradient outside the wrapper); per-block norms, "
            "bucket analysis and attribution stay exact: set on_spike=False"
        )
    for feature, every in (("bucket analysis", buckets), ("attribution", attribution)):
        why = refusal(model, feature) if every else None
        if why is not None:
            raise ValueError(why)


def _bucket_backward(passes, bucket: int, last: bool) -> None:
    """One backward of sum_t coef_t [t in bucket] log pi_t over the update's (pass, bucket index [N, T])
    pairs, into `.grad`."""
    for j, (p, idx) in enumerate(passes):
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
            _bucket_backward(passes, b, last=i == len(buckets) - 1)
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


def agree_on_buckets(passes, *, edges, agreement, step: int, analyse: bool) -> list[int]:
    """The one agreement before an update's gradient norms are read from sharded gradients (that read,
    and the bucket passes, are collectives): every rank posts whether it can take part and, on a bucket
    step, which buckets hold a moving token of its passes. Returns the union of those buckets (every rank
    runs a pass for each); a rank that left the step, died or (on a bucket step) tracked no pass of the
    update makes every rank raise one line (record/buckets/agreement.py)."""
    from tokengrad.record.buckets.agreement import NO_PASS, READY

    nb = len(edges) - 1
    mine = [0.0] * nb
    live = _live(passes, edges) if analyse else []
    for p, idx in live:
        for b in bk.active_buckets(p.coef, p.in_loss, idx, nb):
            mine[b] = 1.0
    status = READY if live or not analyse else NO_PASS
    what = "bucket analysis" if analyse else "gradient norms"
    flags = agreement.agree(what, step=step, status=status, values=mine)
    return [b for b in range(nb) if flags[b] > 0]


def _live(passes, edges) -> list:
    """(pass, bucket index [N, T]) of the passes whose graph is still there to run bucket passes on."""
    indexed = [(p, bk.bucket_index(p.tensors["prob"], edges)) for p in passes]
    return [(p, idx) for p, idx in indexed if p.coef is not None and getattr(p.logprobs, "grad_fn", None)]


def sharded_bucket_figures(passes, model, *, edges, active: list[int]) -> tuple[dict, list[int]]:
    """(figures as bucket_shares gives them, token counts per bucket summed over ranks) of one update
    whose gradient is sharded, for the buckets `active` agreed on (agree_on_buckets). Every rank calls it
    (it runs collectives)."""
    nb = len(edges) - 1
    part = stream_bucket_figures(_live(passes, edges), model, active, nb) if active else _no_pass(model, nb)
    counts = [0.0] * nb
    for p in passes:
        idx = bk.bucket_index(p.tensors["prob"], edges)  # [N, T]
        counts = [c + float(((idx == b) & p.in_loss).sum()) for b, c in enumerate(counts)]
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
