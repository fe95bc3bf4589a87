"""The directional derivative of log pi where each rank holds only a shard of the parameters (FSDP2).

Attribution needs <grad log pi_t, v> for every token at once (record/attribution/shares.py: update_share_t =
coef_t <grad log pi_t, g> / |g|^2, arXiv 2505.12929 refined to tokens). Forward-mode AD cannot pass through
FSDP's all-gathers (they carry no tangent), and the model cannot be evaluated at substituted full
parameters without gathering them. So the central difference is taken at perturbed shards, in place:

    theta_r <- theta_r + h v_r on every rank r,   f+ = log pi(theta + h v)   (FSDP gathers the shards)
    theta_r <- theta_r - h v_r,                   f- = log pi(theta - h v)
    d log pi[v] = (f+ - f-) / 2h,   h = eps |theta| / |v|  (norms over all ranks: summed squared shards)

with the same h, error and default eps as `central_difference` on full parameters (shares.py). The
shard of theta is saved first (one buffer the size of the rank's parameter shard) and copied back, so the
parameters are bit-exactly what they were afterwards; the gathered copies FSDP2 keeps of the root's parameters
are dropped around each forward, so every forward gathers the shards as they are then. Every rank runs the two
forwards (each runs FSDP's all-gathers).
"""

from __future__ import annotations

import math

import torch

from tokengrad.record import distributed as dist
from tokengrad.record.attribution.shares import ATTRIBUTION_METHODS, Recompute, default_eps, sq_norm
from tokengrad.record.buckets.sharded import local_shard


@ATTRIBUTION_METHODS.register("shard_difference")
@torch.no_grad()
def shard_difference_logprobs(
    model: torch.nn.Module, recompute: Recompute, tangents: dict[str, torch.Tensor], eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi [N, T], d log pi along `tangents` [N, T]) by two forwards at theta +- h v, moving each
    rank's parameter shards in place; `tangents` maps parameter names to full-shape DTensors or to this
    rank's local shards. The sharded counterpart of `central_difference` (same eps)."""
    named = dict(model.named_parameters())
    names = [n for n in tangents if n in named]
    theta = [local_shard(named[n].data) for n in names]  # views of this rank's shards
    v = [local_shard(tangents[n]).to(t.dtype) for n, t in zip(names, theta)]
    v_sq, th_sq = dist.all_reduce([sq_norm(v), sq_norm(theta)]).tolist()
    if v_sq == 0.0:
        out = _logprobs(recompute)
        return out.float(), torch.zeros_like(out).float()
    eps = default_eps(theta[0].dtype) if eps is None else float(eps)
    h = eps * math.sqrt(max(th_sq, 1.0)) / math.sqrt(v_sq)
    saved = [t.clone() for t in theta]  # [shard] the one buffer
    outs = []
    try:
        for sign in (1.0, -1.0):
            torch._foreach_copy_(theta, saved)
            torch._foreach_add_(theta, v, alpha=sign * h)
            _drop_gathered(model)
            outs.append(_logprobs(recompute).double())
    finally:
        torch._foreach_copy_(theta, saved)
        _drop_gathered(model)
    plus, minus = outs
    return ((plus + minus) / 2).float(), ((plus - minus) / (2 * h)).float()  # [N, T] each


def _drop_gathered(model: torch.nn.Module) -> None:
    """Free every FSDP2 module's gathered parameters, so that the next forward gathers the shards as they
    are now: FSDP2 keeps the root module's parameters gathered after a forward (reshard_after_forward
    defaults to False there), which would otherwise still hold theta when the shards hold theta +- h v."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _logprobs(recompute: Recompute) -> torch.Tensor:
    out = recompute()
    if not torch.is_tensor(out) or out.dim() != 2:
        raise ValueError(
            f"recompute() must return the [N, T] log-probs of the pass, got "
            f"{type(out).__name__} {tuple(getattr(out, 'shape', ()))}"
        )
    return out.detach()
