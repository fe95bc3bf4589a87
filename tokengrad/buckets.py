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
    return torch.bucketize(prob.contiguous(), inner, right=True)     # [N, T] in 0..len(edges)-2


def validate_edges(edges) -> tuple[float, ...]:
    edges = tuple(float(e) for e in edges)
    if len(edges) < 2 or edges[0] != 0.0 or edges[-1] != 1.0 or any(a >= b for a, b in zip(edges, edges[1:])):
        raise ValueError(f"bucket edges must increase strictly from 0 to 1, got {edges}")
    return edges


def bucket_gradients(logprobs: torch.Tensor, coef: torch.Tensor, in_loss: torch.Tensor, bucket: torch.Tensor,
                     n_buckets: int, params: list[torch.Tensor]) -> list[list[torch.Tensor] | None]:
    """g_B for every bucket: one backward of sum_{t in B} coef_t log pi_t each; frees the graph at the end.

    Args:
        logprobs: [N, T] with its autograd graph retained.  coef: [N, T] dL/dlog pi.
        in_loss: [N, T] bool.  bucket: [N, T] bucket index.  params: trainable parameters.
    Returns: per bucket a list of per-parameter gradients (None for an empty bucket).
    """
    grads: list[list[torch.Tensor] | None] = [None] * n_buckets
    coef = torch.nan_to_num(coef.detach())                             # [N, T]
    todo = [b for b in range(n_buckets) if bool(((bucket == b) & in_loss).any())]
    for i, b in enumerate(todo):
        go = coef * ((bucket == b) & in_loss).to(coef.dtype)           # [N, T] grad_output selecting B
        g = torch.autograd.grad(logprobs, params, grad_outputs=go.to(logprobs.dtype),
                                retain_graph=i < len(todo) - 1, allow_unused=True)
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


@torch.no_grad()
def bucket_shares(store: list[list[torch.Tensor] | None], total: list[torch.Tensor]) -> dict:
    """Norms, update shares and cosines of the bucket gradients against the full gradient `total`.

    Returns dict with lists grad_norm, update_share, cos_to_total (NaN for empty buckets) and the residual's
    grad_norm and update_share.
    """
    g_sq = _sq_norm(total)
    out = {"grad_norm": [], "update_share": [], "cos_to_total": []}
    resid = [t.double().clone() for t in total]
    for g_b in store:
        if g_b is None:
            for k in out:
                out[k].append(0.0 if k == "grad_norm" else (0.0 if k == "update_share" else math.nan))
            continue
        nb = math.sqrt(_sq_norm(g_b))
        dot = sum(float(torch.dot(a.double().flatten(), t.double().flatten())) for a, t in zip(g_b, total))
        out["grad_norm"].append(nb)
        out["update_share"].append(dot / g_sq if g_sq > 0 else math.nan)
        out["cos_to_total"].append(dot / (nb * math.sqrt(g_sq)) if nb > 0 and g_sq > 0 else math.nan)
        torch._foreach_sub_(resid, [a.double() for a in g_b])
    out["residual_grad_norm"] = math.sqrt(_sq_norm(resid))
    shares = [s for s in out["update_share"] if not math.isnan(s)]
    out["residual_share"] = 1.0 - sum(shares) if g_sq > 0 else math.nan
    return out


def _sq_norm(tensors: list[torch.Tensor]) -> float:
    if not tensors:
        return 0.0
    return float(torch.stack([t.double().pow(2).sum() for t in tensors]).sum())


@torch.no_grad()
def prob_change(prob_before: torch.Tensor, logprob_after: torch.Tensor, advantages: torch.Tensor,
                in_loss: torch.Tensor, bucket: torch.Tensor, n_buckets: int) -> tuple[list[float], list[float]]:
    """Per bucket: mean change of probability over the update, and the "correct ratio" (AR-Lopti §4):
    the share of positive-advantage tokens whose probability rose.  Inputs [N, T]."""
    dp = logprob_after.float().exp() - prob_before.float()             # [N, T]
    means, correct = [], []
    for b in range(n_buckets):
        sel = (bucket == b) & in_loss                                   # [N, T]
        means.append(float(dp[sel].mean()) if sel.any() else math.nan)
        pos = sel & (advantages > 0)                                    # [N, T]
        correct.append(float((dp[pos] > 0).float().mean()) if pos.any() else math.nan)
    return means, correct
