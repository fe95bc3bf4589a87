"""Exact gradient of each probability bucket, and its share of the update.

Because the loss reaches the parameters only through the per-token log-probs (plus terms not built on
log pi, e.g. an entropy bonus), the chain rule gives

    grad L = sum_t coef_t * grad log pi_t,      coef_t = dL/dlog pi_t

so the bucket gradient g_B = grad sum_{t in B} coef_t log pi_t is exact with one extra backward pass per
bucket (AR-Lopti arXiv 2505.12929, Fig. 1, buckets [0, .25, .5, .75, 1]). With g the full gradient:

    update_share_B = <g_B, g> / |g|^2,    sum_B update_share_B + residual = 1,
    cos_B = <g_B, g> / (|g_B| |g|),

where the residual is the part of g from loss terms not built on log pi.
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
    in_loss: torch.Tensor,
    bucket: torch.Tensor,
    n_buckets: int,
    params: list[torch.Tensor],
) -> list[list[torch.Tensor] | None]:
    """g_B for every bucket: one backward of sum_{t in B} coef_t log pi_t each; frees the graph at the end.

    Args:
        logprobs: [N, T] with its autograd graph retained.  coef: [N, T] dL/dlog pi.
        in_loss: [N, T] bool.  bucket: [N, T] bucket index.  params: trainable parameters.
    Returns: per bucket a list of per-parameter gradients (None for a bucket without a token of non-zero
    coef).
    """
    grads: list[list[torch.Tensor] | None] = [None] * n_buckets
    coef = torch.nan_to_num(coef.detach())  # [N, T]
    # a bucket whose tokens all have coef 0 (e.g. groups with equal rewards: advantage 0) has g_B = 0
    # exactly; its pass is skipped and the bucket kept empty (norm 0, share 0, as a zero gradient gives)
    moving = in_loss & (coef != 0)  # [N, T]
    todo = [b for b in range(n_buckets) if bool(((bucket == b) & moving).any())]
    for i, b in enumerate(todo):
        go = coef * ((bucket == b) & in_loss).to(coef.dtype)  # [N, T] grad_output selecting B
        g = torch.autograd.grad(
            logprobs,
            params,
            grad_outputs=go.to(logprobs.dtype),
            retain_graph=i < len(todo) - 1,
            allow_unused=True,
        )
        grads[b] = [torch.zeros_like(p) if gi is None else gi for p, gi in zip(params, g)]
    return grads


def accumulate(store: list[list[torch.Tensor] | None], new: list[list[torch.Tensor] | None]) -> None:
    """store[b] += new[b] per parameter (several backward passes feeding one optimizer update)."""
    for b, g in enumerate(new):
        if g is None:
            continue
        if store[b] is None:
            store[b] = g
        else:
            torch._foreach_add_(store[b], g)


SLICE = 1 << 22  # elements per float64 slice: bounds the extra memory of the share computation (~32 MB)


@torch.no_grad()
def bucket_shares(store: list[list[torch.Tensor] | None], total: list[torch.Tensor]) -> dict:
    """Norms, update shares and cosines of the bucket gradients against the full gradient `total`.

    Accumulates in float64 over flat parameter slices, so no float64 copy of the whole model is made.
    Returns dict with lists grad_norm, update_share, cos_to_total (0/0/NaN for empty buckets) and the
    residual's grad_norm and update_share.
    """
    nb = len(store)
    dots, sq_b = [0.0] * nb, [0.0] * nb
    g_sq = resid_sq = 0.0
    for i, t in enumerate(total):
        flat_t = t.reshape(-1)
        for s in range(0, flat_t.numel(), SLICE):
            tg = flat_t[s : s + SLICE].double()  # [S]
            resid = tg.clone()
            for b, g_b in enumerate(store):
                if g_b is None:
                    continue
                gb = g_b[i].reshape(-1)[s : s + SLICE].double()  # [S]
                dots[b] += float(torch.dot(gb, tg))
                sq_b[b] += float(torch.dot(gb, gb))
                resid -= gb
            g_sq += float(torch.dot(tg, tg))
            resid_sq += float(torch.dot(resid, resid))
    out = {"grad_norm": [], "update_share": [], "cos_to_total": []}
    for b in range(nb):
        nbn = math.sqrt(sq_b[b])
        empty = store[b] is None
        out["grad_norm"].append(nbn)
        # no gradient at all (every advantage 0): shares are undefined, not 0
        out["update_share"].append(math.nan if g_sq == 0 else (0.0 if empty else dots[b] / g_sq))
        out["cos_to_total"].append(
            math.nan if empty or nbn == 0 or g_sq == 0 else dots[b] / (nbn * math.sqrt(g_sq))
        )
    out["residual_grad_norm"] = math.sqrt(resid_sq)
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
