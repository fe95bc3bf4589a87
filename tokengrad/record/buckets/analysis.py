"""Exact gradient of each probability bucket, and its share of the update.

Because the loss reaches the parameters only through the per-token log-probs (plus terms not built on
log pi, e.g. an entropy bonus), the chain rule gives

    grad L = sum_t coef_t * grad log pi_t,      coef_t = dL/dlog pi_t

so the bucket gradient g_B = grad sum_{t in B} coef_t log pi_t is exact with one extra backward pass per
bucket (AR-Lopti arXiv 2505.12929, Fig. 1, buckets [0, .25, .5, .75, 1]). With g the full gradient:

    update_share_B = <g_B, g> / |g|^2,    sum_B update_share_B + residual = 1,
    cos_B = <g_B, g> / (|g_B| |g|),

where the residual is the part of g from loss terms not built on log pi.

Where the update's gradient provably has no residual (`residual_free`: every path from the loss to a
parameter runs through the tracked log-probs, every coef finite and 0 outside the loss tokens, the
gradients empty when the update began), g = sum_B g_B, so one bucket (the `derived` one) needs no pass:
g_D = g - sum_{B != D} g_B. K buckets then cost K - 1 backward passes; `bucket_shares` takes g_D's norm
and product with g from g minus the others, slice by slice, without forming g_D.
"""

from __future__ import annotations

import math

import torch


def bucket_index(prob: torch.Tensor, edges: tuple[float, ...]) -> torch.Tensor:
    """Bucket of each probability: [lo, hi), the last bucket closed at 1.  prob [N, T] -> [N, T] long."""
    inner = torch.tensor(edges[1:-1], dtype=prob.dtype, device=prob.device)
    return torch.bucketize(prob.contiguous(), inner, right=True)  # [N, T] in 0..len(edges)-2


def validate_edges(edges) -> tuple[float, ...]:
    edges = tuple(float(e) for e in edges)
    if len(edges) < 2 or edges[0] != 0.0 or edges[-1] != 1.0 or any(a >= b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket edges must increase strictly from 0 to 1, got {edges}")
    return edges


def bucket_gradients(
    logprobs: torch.Tensor,
    coef: torch.Tensor,
    *,
    in_loss: torch.Tensor,
    bucket: torch.Tensor,
    n_buckets: int,
    params: list[torch.Tensor],
    skip: int | None = None,
    keep_graph: bool = False,
) -> list[list[torch.Tensor] | None]:
    """g_B for every bucket but `skip`: one backward of sum_{t in B} coef_t log pi_t each; frees the graph
    at the end
    (unless `keep_graph`).

    Args:
        logprobs: [N, T] with its autograd graph retained.  coef: [N, T] dL/dlog pi.
        in_loss: [N, T] bool.  bucket: [N, T] bucket index.  params: trainable parameters.
        skip: a bucket left without a pass (the derived bucket, from g minus the others), or None.
        keep_graph: keep the graph after the last pass (another analysis of the same pass follows).
    Returns: per bucket a list of per-parameter gradients (None for a bucket without a token of non-zero
    coef, and for `skip`).
    """
    grads: list[list[torch.Tensor] | None] = [None] * n_buckets
    todo = [b for b in active_buckets(coef, in_loss, bucket, n_buckets) if b != skip]
    coef = torch.nan_to_num(coef.detach())  # [N, T]
    for i, b in enumerate(todo):
        go = coef * ((bucket == b) & in_loss).to(coef.dtype)  # [N, T] grad_output selecting B
        g = torch.autograd.grad(
            logprobs,
            params,
            grad_outputs=go.to(logprobs.dtype),
            retain_graph=keep_graph or i < len(todo) - 1,
            allow_unused=True,
        )
        grads[b] = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(params, g)]
    return grads


def active_buckets(
    coef: torch.Tensor, in_loss: torch.Tensor, bucket: torch.Tensor, n_buckets: int
) -> list[int]:
    """Buckets holding a loss token of non-zero coef. A bucket whose tokens all have coef 0 (e.g. groups
    with equal rewards: advantage 0) has g_B = 0 exactly: its pass is skipped and the bucket kept empty
    (norm 0, share 0, as a zero gradient gives).  Inputs [N, T]."""
    moving = in_loss & (torch.nan_to_num(coef.detach()) != 0)  # [N, T]
    return [b for b in range(n_buckets) if bool(((bucket == b) & moving).any())]


def largest_bucket(coef: torch.Tensor, in_loss: torch.Tensor, bucket: torch.Tensor, n_buckets: int) -> int:
    """The bucket of largest sum |coef| over loss tokens: the one to derive as g minus the others, so the
    float32 rounding of g (~1e-7 |g|) stays small against the derived |g_D|.  Inputs [N, T]."""
    w = (coef.detach().abs() * in_loss).double()  # [N, T]
    mass = torch.zeros(n_buckets, dtype=torch.float64, device=w.device).index_add_(
        0, bucket.reshape(-1), w.reshape(-1)
    )
    return int(mass.argmax())


@torch.no_grad()
def coef_is_whole(coef: torch.Tensor, in_loss: torch.Tensor) -> bool:
    """The bucket passes together give the pass's whole log-pi gradient: coef finite and 0 off the loss
    tokens (a coef off them would reach g but no bucket).  [N, T] each."""
    return bool(torch.isfinite(coef).all()) and not bool((coef * ~in_loss).any())


def residual_free(loss: torch.Tensor, logprobs: list[torch.Tensor]) -> bool:
    """Every path of the autograd graph from `loss` to a leaf that requires grad (a parameter) runs through
    one of `logprobs`: the gradient is sum_t coef_t grad log pi_t with no residual term.  Walks the graph
    from the loss, stopping at the log-probs' nodes (a few nodes when true; the whole graph when not)."""
    stops = {lp.grad_fn for lp in logprobs if lp.grad_fn is not None}
    if loss.grad_fn is None or not stops:
        return False
    seen, todo = set(), [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen or node in stops:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad: a leaf reached around the log-probs
            return False
        todo.extend(nxt for nxt, _ in node.next_functions)
    return True


def accumulate(store: list[list[torch.Tensor] | None], new: list[list[torch.Tensor] | None]) -> None:
    """store[b] += new[b] per parameter (several backward passes feeding one optimizer update)."""
    for b, g in enumerate(new):
        if g is None:
            continue
        if store[b] is None:
            store[b] = g
        else:
            torch._foreach_add_(store[b], g)


# elements per slice: float32 products summed within a slice by one matrix product (relative error
# ~1e-7), the slices summed in float64; bounds the extra memory to (K + 2) slices
SLICE = 1 << 16


@torch.no_grad()
def products(store: list[list[torch.Tensor] | None], total: list[torch.Tensor]) -> tuple[torch.Tensor, list]:
    """Inner products of the non-empty bucket gradients and `total`: ([K + 1, K + 1] float64 Gram matrix,
    `total` last; [|r|^2, <r, g>] of r = g - sum_B g_B, the residual or the derived bucket). One matrix
    product per parameter slice; each gradient is read once and no float64 copy of the model is made."""
    have = [g for g in store if g is not None]
    k = len(have)
    device = total[0].device if total else "cpu"
    G = torch.zeros(k + 1, k + 1, dtype=torch.float64, device=device)
    r = torch.zeros(2, dtype=torch.float64, device=device)
    for i, t in enumerate(total):
        flat = [g[i].reshape(-1) for g in have] + [t.reshape(-1)]
        for s in range(0, flat[-1].numel(), SLICE):
            rows = torch.stack([f[s : s + SLICE].to(device) for f in flat]).float()  # [K + 1, S]
            resid = rows[k] - rows[:k].sum(0)  # [S]
            G += (rows @ rows.T).double()
            r += torch.stack([resid @ resid, resid @ rows[k]]).double()
    return G.cpu(), r.tolist()


@torch.no_grad()
def bucket_shares(
    store: list[list[torch.Tensor] | None], total: list[torch.Tensor], *, derived: int | None = None
) -> dict:
    """Norms, update shares and cosines of the bucket gradients against the full gradient `total`.

    `derived`: a bucket without its own gradient, g_D = g - sum of the others (a residual-free update, see
    the module doc): what would be the residual is g_D, and the residual is 0.
    Returns dict with lists grad_norm, update_share, cos_to_total (0/0/NaN for empty buckets) and the
    residual's grad_norm and update_share.
    """
    nb = len(store)
    if derived is not None and store[derived] is not None:
        raise ValueError(f"bucket {derived} is derived from the total yet has a gradient of its own")
    idx = [b for b in range(nb) if store[b] is not None]
    G, (resid_sq, resid_dot) = products(store, total)  # [K + 1, K + 1]
    k = len(idx)
    g_sq = float(G[k, k])
    dots = dict(zip(idx, G[:k, k].tolist()))
    sq_b = dict(zip(idx, G.diagonal()[:k].tolist()))
    if derived is not None:  # g - sum of the others is the derived bucket, not a residual
        dots[derived], sq_b[derived], resid_sq = resid_dot, resid_sq, 0.0
    return figures(sq_b, dots, g_sq, resid_sq, nb)


def figures(sq_b: dict, dots: dict, g_sq: float, resid_sq: float, n_buckets: int) -> dict:
    """The bucket figures from |g_B|^2 and <g_B, g> of the non-empty buckets (dicts by bucket), |g|^2 and
    the residual's |r|^2: lists grad_norm, update_share, cos_to_total (0/0/NaN for empty buckets) and the
    residual's grad_norm and update_share."""
    out = {"grad_norm": [], "update_share": [], "cos_to_total": []}
    for b in range(n_buckets):
        nbn = math.sqrt(max(sq_b.get(b, 0.0), 0.0))
        empty = b not in dots
        out["grad_norm"].append(nbn)
        # no gradient at all (every advantage 0): shares are undefined, not 0
        out["update_share"].append(math.nan if g_sq == 0 else (0.0 if empty else dots[b] / g_sq))
        out["cos_to_total"].append(
            math.nan if empty or nbn == 0 or g_sq == 0 else dots[b] / (nbn * math.sqrt(g_sq))
        )
    out["residual_grad_norm"] = math.sqrt(max(resid_sq, 0.0))
    out["residual_share"] = 1.0 - sum(out["update_share"]) if g_sq > 0 else math.nan
    return out


@torch.no_grad()
def union_of_passes(
    sample_ids: torch.Tensor, passes: list, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The step's loss tokens over every pass, on the rows `sample_ids` ([N]): (in_loss [N, T] bool,
    log pi_old [N, T], advantage [N, T]), from passes given as (sample_ids [n], in_loss [n, T],
    old_logprob [n, T], advantage [n, T] or None); rows a pass holds but `sample_ids` lacks are skipped."""
    N, T = like.shape
    where = {int(s): i for i, s in enumerate(sample_ids.tolist())}
    in_loss = torch.zeros(N, T, dtype=torch.bool, device=like.device)
    old, adv = torch.zeros(N, T, device=like.device), torch.zeros(N, T, device=like.device)
    for sid, sel, lp, a in passes:
        if tuple(sel.shape[1:]) != (T,):
            continue
        idx = torch.tensor([where.get(int(s), -1) for s in sid.tolist()], device=like.device)  # [n]
        ok = idx >= 0
        idx, sel = idx[ok], sel[ok]
        in_loss[idx] |= sel
        old[idx] = torch.where(sel, lp[ok], old[idx])
        adv[idx] = torch.where(sel, (a if a is not None else torch.zeros_like(lp))[ok], adv[idx])
    return in_loss, old, adv


@torch.no_grad()
def prob_change(
    old_logprob: torch.Tensor,
    new_logprob: torch.Tensor,
    *,
    advantages: torch.Tensor,
    in_loss: torch.Tensor,
    bucket: torch.Tensor,
    n_buckets: int,
) -> tuple[list[float], list[float]]:
    """Per bucket: mean change of probability over the update(s) of tokens with A != 0, and the "correct
    ratio" (AR-Lopti, arXiv 2505.12929, Sec. 4): the share of A > 0 tokens whose log-prob rose, comparing
    log-probs (a rise below fp32 probability resolution counts) and leaving out tokens already at p = 1,
    which cannot rise. Inputs [N, T]; NaN for a bucket without such tokens."""
    old, new = old_logprob.float(), new_logprob.float()  # [N, T]
    dp = new.exp() - old.exp()  # [N, T]
    means, correct = [], []
    for b in range(n_buckets):
        sel = (bucket == b) & in_loss  # [N, T]
        moved = sel & (advantages != 0)  # A = 0 tokens had no push (AR-Lopti leaves them out)
        means.append(float(dp[moved].mean()) if moved.any() else math.nan)
        pos = sel & (advantages > 0) & (old < 0)  # [N, T]
        correct.append(float((new[pos] > old[pos]).float().mean()) if pos.any() else math.nan)
    return means, correct
