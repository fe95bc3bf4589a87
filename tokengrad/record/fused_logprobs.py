"""Per-token log-probs with their statistics in the same pass: the recorder's statistics for free.

    logprobs, stats = logprobs_with_stats(logits, token_ids)     # logprobs [N, T] with grad
    st.track(logprobs, token_ids=token_ids, stats=stats, ...)

A plain loop computes `log_softmax(logits.float()).gather(...)`: one exp pass over the vocabulary, and an
fp32 [N, T, V] output kept for backward. Recording then needs softmax statistics (entropy, sum_j p_j^2),
a second exp pass. This function computes log p_t, entropy and sum_j p_j^2 from one exp pass per row
chunk (see tokengrad.record.stats for the formulas), keeps nothing vocabulary-sized for backward, and
recomputes p chunk by chunk in backward, where

    d log p_y / dz = e_y - p            (arXiv 2505.12929, Prop 4.2)

so the statistics cost nothing extra and the [N, T, V] fp32 log-softmax output is never materialised.
"""

from __future__ import annotations

import torch

from tokengrad.record.stats import CHUNK_ROWS, TokenStats, check_stats_inputs, chunk_stats


class _SelectiveLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, ids: torch.Tensor, chunk_rows: int):
        N, T, V = logits.shape
        dev = logits.device
        logp = torch.empty(N, T, dtype=torch.float32, device=dev)  # [N, T]
        ent = torch.empty_like(logp)  # [N, T]
        s2 = torch.empty_like(logp)  # [N, T]
        unit = torch.empty_like(logp)  # [N, T] |p - e_y|
        mx = torch.empty_like(logp)  # [N, T] row max, for backward
        log_z = torch.empty_like(logp)  # [N, T] log sum_j exp(z_j - max)
        c = max(1, min(chunk_rows, T))
        d = torch.empty(c, V, dtype=torch.float32, device=dev)  # [c, V] reused buffers
        e = torch.empty(c, V, dtype=torch.float32, device=dev)
        for n in range(N):
            for s in range(0, T, c):
                x = logits[n, s : s + c]  # [k, V] view
                k = x.shape[0]
                m = x.amax(-1).float()  # [k]
                lp, h, q, u = chunk_stats(x, ids[n, s : s + k], d[:k], e[:k])
                logp[n, s : s + k], ent[n, s : s + k], s2[n, s : s + k], unit[n, s : s + k] = lp, h, q, u
                # kept apart so that backward's z - max stays exact for logits of +-1e4:
                # log p_y = (z_y - max) - log Z  ->  log Z = (z_y - max) - log p_y
                mx[n, s : s + k] = m
                log_z[n, s : s + k] = x.gather(1, ids[n, s : s + k].unsqueeze(1)).squeeze(1).float() - m - lp
        ctx.save_for_backward(logits, ids, mx, log_z)
        ctx.chunk_rows = c
        ctx.mark_non_differentiable(ent, s2, unit)
        return logp, ent, s2, unit

    @staticmethod
    def backward(ctx, g_logp: torch.Tensor, _g_ent, _g_s2, _g_unit):
        logits, ids, mx, log_z = ctx.saved_tensors
        N, T, V = logits.shape
        c = ctx.chunk_rows
        grad = torch.empty_like(logits)  # [N, T, V]
        buf = torch.empty(c, V, dtype=torch.float32, device=logits.device)
        for n in range(N):
            for s in range(0, T, c):
                x = logits[n, s : s + c]  # [k, V]
                k = x.shape[0]
                p = buf[:k]
                torch.sub(x.float() if x.dtype != torch.float32 else x, mx[n, s : s + k, None], out=p)
                p.sub_(log_z[n, s : s + k, None]).exp_()  # softmax, recomputed
                g = g_logp[n, s : s + k].float()  # [k]
                p.mul_(-g[:, None])  # -g p
                p.scatter_add_(1, ids[n, s : s + k, None], g[:, None])  # + g e_y
                grad[n, s : s + k] = p
        return grad, None, None


def logprobs_with_stats(
    logits: torch.Tensor, token_ids: torch.Tensor, chunk_rows: int = CHUNK_ROWS
) -> tuple[torch.Tensor, TokenStats]:
    """log pi(token) [N, T] (fp32, differentiable w.r.t. logits) and the token's TokenStats (no grad).

    Args:
        logits: [N, T, V] any float dtype; position t scores token_ids[:, t].
        token_ids: [N, T] integer ids.
    """
    check_stats_inputs(logits, token_ids, None)
    logp, ent, s2, unit = _SelectiveLogSoftmax.apply(logits, token_ids, chunk_rows)
    return logp, TokenStats(
        logprob=logp.detach(), prob=logp.detach().exp(), entropy=ent, sum_p2=s2, logit_grad_unit=unit
    )
