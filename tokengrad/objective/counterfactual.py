"""What another weighting rule would have asked of the same tokens: its loss coefficients.

The GRPO loss reaches the parameters only through the per-token log-probs, so a rule R's gradient at the
parameters theta on a batch is

    g_R = sum_t c^R_t grad log pi_t,        c^R_t = dL_R / dlog pi_t

with L_R the policy loss of ``tokengrad.objective.loss`` under R's token weights (R's weights, the PPO clip,
the KL term and the aggregation, all evaluated on the recorded log pi, log pi_old, advantages and masks).
c^R is exact from the detached values alone: it is the derivative of L_R with respect to a leaf copy of
log pi (one autograd pass over [N, T] tensors, no model). The recorder then turns it into g_R with one
backward of the model's retained graph per coefficient vector (tokengrad.record.buckets.whatif).

A rule with phases (Lopti, arXiv 2505.12929) gives one coefficient vector per phase; the phases' masks come
from pi_old as in the trainer, each normalised over the whole loss mask (``policy_loss``'s ``loss_mask``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from tokengrad.objective.loss import normaliser, phase_masks, policy_loss
from tokengrad.objective.rule_contract import TokenBatch
from tokengrad.objective.weighting import get_weighting

# policy_loss's settings a counterfactual takes from the host's loss, and their defaults
LOSS_KEYS = {
    "eps_low": 0.2,
    "eps_high": 0.2,
    "beta": 0.0,
    "aggregation": "grpo",
    "max_len": None,
    "clip_ratio_c": 0.0,
}


def loss_settings(loss: Mapping | None) -> dict:
    """The counterfactual loss's settings: ``LOSS_KEYS`` with those given; an unknown key names the known."""
    loss = dict(loss or {})
    unknown = sorted(set(loss) - set(LOSS_KEYS))
    if unknown:
        raise ValueError(f"whatif loss settings {unknown} unknown; known: {sorted(LOSS_KEYS)}")
    return {**LOSS_KEYS, **loss}


def rule_coefs(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    rule: str,
    params: Mapping,
    loss: Mapping,
    ref_logprobs: Tensor | None = None,
    is_weight: Tensor | None = None,
) -> list[tuple[Tensor, Tensor]]:
    """(c^R = dL_R/dlog pi, the update's loss mask) of rule ``rule`` on these tokens, [N, T] each, one pair
    per update the rule makes (one, or one per phase), each for a loss aggregated over ``mask`` alone
    (``pass_weight`` of the mask gives the micro-batch's weight in a larger batch).

    Args ([N, T] unless noted; all detached): logprobs and old_logprobs, log pi_theta and log pi_old;
    advantages [N] or [N, T]; mask 1 = loss token; loss: ``loss_settings``; ref_logprobs for beta > 0;
    is_weight the rollout correction's weight (None = 1)."""
    weighting = get_weighting(rule)
    lp = logprobs.detach().float()  # [N, T]
    m = mask.detach().to(lp.dtype)  # [N, T]
    weights = weighting(
        TokenBatch(logprobs=lp, old_logprobs=old_logprobs, advantages=advantages, mask=m), **params
    )
    out = []
    for phase in phase_masks(weights, m):  # each [N, T]
        leaf = lp.clone().requires_grad_(True)  # [N, T]
        res = policy_loss(
            leaf,
            old_logprobs.detach().float(),
            advantages.detach().float(),
            phase,
            weights,
            loss_mask=m,
            ppo_clip=weighting.ppo_clip,
            ref_logprobs=ref_logprobs,
            is_weight=is_weight,
            **loss,
        )
        (coef,) = torch.autograd.grad(res.loss, leaf)  # [N, T]
        out.append((torch.where(m > 0, coef, 0.0), phase > 0))
    return out


def pass_weight(aggregation: str, mask: Tensor) -> float:
    """A micro-batch's weight when several are accumulated into one update: its aggregation's normaliser
    (tokens for a token mean, rows for a sequence mean), so that sum_p w_p g_p / sum_p w_p is the gradient
    of one pass over all of them (``tokengrad.objective.loss.micro_batch_share``)."""
    return normaliser(aggregation, mask)
