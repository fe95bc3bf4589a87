"""The GRPO policy loss: PPO-clip surrogate, token weights, k3 KL, and a named aggregation.

    from tokengrad.objective.loss import policy_loss, phase_masks
    weights = get_weighting("lopti")(TokenBatch(logprobs, old, adv, mask))
    for phase in phase_masks(weights, mask):                      # one update per phase
        out = policy_loss(logprobs, old, adv, phase, weights, loss_mask=mask, aggregation="dapo")
        out.loss.backward()

Three separate steps, each loggable per token: the weighting rule (``tokengrad.objective.weighting``), the
surrogate (``policy_loss``) and the aggregation (``AGGREGATIONS``: name -> fn(per_token_loss [N, T],
mask [N, T], max_len) -> scalar).

``policy_loss`` per token (GRPO, arXiv:2402.03300; asymmetric clip, arXiv:2503.14476), with
r = exp(logprobs - old_logprobs), A' = A * advantage_weight and u = r * ratio_weight:

    s_t = min(u A', clip(u, 1 - eps_low, 1 + eps_high) A')      (u A' when ppo_clip is False)
    s_t = max(s_t, c A') where A' < 0                           (dual-clip, when clip_ratio_c = c > 0)
    loss_t = w_t (-s_t * loss_weight + kl_cov_coef * |log r|) + beta * k3(logprobs, ref_logprobs)

then aggregated by ``AGGREGATIONS[aggregation]``. The rule's weights are detached; ``loss_weight`` scales
the policy-gradient term only. |log r| counts as 0 below fp32 rounding (``ROUNDING``). w_t: the rollout
correction's importance weight (``_per_token_loss``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from tokengrad.objective.rule_contract import (
    TokenWeights,
    broadcast_tokens,
    check_finite,
    check_token_tensors,
)
from tokengrad.registry import Registry

Aggregation = Callable[
    [Tensor, Tensor, "int | None"], Tensor
]  # (per_token_loss [N, T], mask [N, T], max_len) -> scalar
AGGREGATIONS: Registry[Aggregation] = Registry("aggregation")


def register_aggregation(name: str, *, normaliser: Callable[[Tensor], float]) -> Callable:
    """Decorator: ``AGGREGATIONS[name] = fn``, together with what ``fn`` divides by, as a function of the
    [N, T] loss mask. The normaliser is what makes gradient accumulation and DDP exact: a micro-batch's (or a
    rank's) loss is weighted by its share of the whole batch's normaliser (``micro_batch_share``), so an
    aggregation cannot be registered without one."""
    return AGGREGATIONS.register(name, normaliser=normaliser)


def get_aggregation(name: str) -> Aggregation:
    """The aggregation registered as ``name``; unknown names raise ValueError listing the known ones."""
    return AGGREGATIONS[name]


def count_rows(mask: Tensor) -> float:
    """Normaliser of aggregations that average over the N sequences of the batch ([N, T] mask -> N)."""
    return float(mask.shape[0])


def count_tokens(mask: Tensor) -> float:
    """Normaliser of the token mean: the batch's loss tokens ([N, T] mask -> its sum)."""
    return float(mask.sum())


def normaliser(aggregation: str, loss_mask: Tensor) -> float:
    """What ``aggregation`` divides by for this [N, T] loss mask."""
    return get_aggregation(aggregation).normaliser(loss_mask)


def micro_batch_share(aggregation: str, micro_mask: Tensor, full_mask: Tensor) -> float:
    """Weight of a micro-batch's loss in the whole batch's aggregation ([n, T] and [N, T] loss masks), so
    that accumulated micro-batches give the same gradient as one pass over the batch."""
    return normaliser(aggregation, micro_mask) / max(normaliser(aggregation, full_mask), 1.0)


@register_aggregation("grpo", normaliser=count_rows)
def _seq_mean_token_mean(per_token_loss: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    """Mean over sequences of each sequence's token mean (GRPO, arXiv:2402.03300; 1/|o_i| per
    sequence). Every one of the N rows counts in the outer mean, as in TRL and verl."""
    seq = (per_token_loss * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)  # [N]
    return seq.mean()


@register_aggregation("dapo", normaliser=count_tokens)
def _token_mean(per_token_loss: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    """Token mean over the whole batch (DAPO, arXiv:2503.14476; verl "token-mean")."""
    return (per_token_loss * mask).sum() / mask.sum().clamp_min(1.0)


@register_aggregation("dr_grpo", normaliser=count_rows)
def _sum_over_constant(per_token_loss: Tensor, mask: Tensor, max_len: int | None) -> Tensor:
    """Token sum / (N * max_len), a length-independent constant (Dr. GRPO, arXiv:2503.20783; TRL
    divides by B * max_completion_length). ``max_len`` defaults to T."""
    n, t = mask.shape
    return (per_token_loss * mask).sum() / (n * (max_len or t))


@dataclass(frozen=True, kw_only=True)
class LossOutput:
    loss: Tensor  # scalar, to minimise
    per_token_loss: Tensor  # [N, T], 0 outside the mask
    ratio: Tensor  # [N, T] pi_theta / pi_old (unweighted; 1 off the mask)
    clipped: Tensor  # [N, T] bool, the clip removed the token's policy gradient
    kl: Tensor | None  # [N, T] k3 KL to the reference, None without ref_logprobs
    metrics: dict[str, float]  # clip_frac, clip_frac_low, clip_frac_high, ratio_mean, approx_kl, kl_mean, ...


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi_theta || pi_ref): exp(d) - d - 1, d = log pi_ref - log pi_theta
    (Schulman's unbiased, non-negative estimator; GRPO arXiv:2402.03300 Eq. 4). [N, T] -> [N, T]."""
    d = ref_logprobs - logprobs  # [N, T]
    return d.exp() - d - 1.0


def phase_masks(weights: TokenWeights, mask: Tensor) -> list[Tensor]:
    """The loss masks of a step's updates, in order: ``[mask]``, or ``mask * phase`` per phase
    (Lopti). Pass each as ``mask`` and the full mask as ``loss_mask`` to ``policy_loss``."""
    if weights.phases is None:
        return [mask]
    return [mask * phase for phase in weights.phases]  # each [N, T]


def _one(w: Tensor | None) -> Tensor | float:
    return 1.0 if w is None else w.detach()


def _checked_inputs(
    logprobs,
    *,
    old_logprobs,
    advantages,
    mask,
    loss_mask,
    ref_logprobs,
    weights,
    beta,
    is_weight,
    aggregation,
    clip_ratio_c,
) -> tuple[Aggregation, TokenWeights, Tensor, Tensor]:
    """``policy_loss``'s inputs resolved (the aggregation by name, the weights and loss_mask defaults,
    advantages broadcast to [N, T]) and checked: bad input raises a ValueError naming it."""
    if clip_ratio_c != 0.0 and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be 0 (off) or > 1, got {clip_ratio_c}")
    agg = get_aggregation(aggregation)
    weights = weights if weights is not None else TokenWeights()
    loss_mask = mask if loss_mask is None else loss_mask
    advantages = broadcast_tokens(advantages.detach(), logprobs, "advantages")  # [N, T]
    check_token_tensors(
        logprobs=logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        loss_mask=loss_mask,
        ref_logprobs=ref_logprobs,
        loss_weight=weights.loss_weight,
        ratio_weight=weights.ratio_weight,
        advantage_weight=weights.advantage_weight,
        kl_cov_coef=weights.kl_cov_coef,
        is_weight=is_weight,
    )
    if beta != 0.0 and ref_logprobs is None:
        raise ValueError(f"beta={beta} needs ref_logprobs (the frozen reference's log-probs)")
    check_finite(
        mask,
        logprobs=logprobs.detach(),
        old_logprobs=old_logprobs,
        advantages=advantages,
        ref_logprobs=ref_logprobs,
        is_weight=is_weight,
    )
    if is_weight is not None and bool((is_weight[mask > 0] < 0).any()):
        raise ValueError("is_weight must be >= 0 at tokens inside the mask")
    return agg, weights, loss_mask, advantages


def clipped_surrogate(
    u: Tensor,
    adv: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    ppo_clip: bool = True,
    clip_ratio_c: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """PPO's surrogate min(u A, clip(u, 1 - eps_low, 1 + eps_high) A) (arXiv:1707.06347; asymmetric range,
    arXiv:2503.14476), bounded below by c A for A < 0 when clip_ratio_c = c > 0 (dual-clip,
    arXiv:1912.09729). Returns ([N, T] surrogate, [N, T] True where a constant branch won)."""
    surr = u * adv  # [N, T]
    obj, clipped = surr, torch.zeros_like(surr, dtype=torch.bool)  # [N, T]
    if ppo_clip:
        surr_clipped = u.clamp(1.0 - eps_low, 1.0 + eps_high) * adv  # [N, T]
        clipped = surr_clipped < surr  # [N, T] the min picks the constant branch
        obj = torch.minimum(surr, surr_clipped)
    if clip_ratio_c > 0:
        floor = clip_ratio_c * adv  # [N, T]
        dual = (adv < 0) & (floor > obj)  # [N, T] the dual clip's constant wins
        clipped, obj = clipped | dual, torch.where(dual, floor, obj)
    return obj, clipped


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: TokenWeights | None = None,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    beta: float = 0.0,
    ref_logprobs: Tensor | None = None,
    aggregation: str = "grpo",
    max_len: int | None = None,
    loss_mask: Tensor | None = None,
    ppo_clip: bool = True,
    clip_ratio_c: float = 0.0,
    is_weight: Tensor | None = None,
) -> LossOutput:
    """PPO-clip GRPO loss with token weights: loss_t of the module docstring per token, aggregated by
    ``AGGREGATIONS[aggregation]`` (arXiv:2402.03300; asymmetric clip, arXiv:2503.14476).

    Args (tensors [N, T] unless noted; all but ``logprobs`` are detached):
        logprobs, old_logprobs: log pi_theta (carries the gradient) and log pi_old of the sampled tokens.
        advantages: [N] or [N, T]. mask: 1 = token in this loss (for Lopti: ``mask * phase``).
        weights: the weighting rule's ``TokenWeights`` (default: none).
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high]; ppo_clip=False drops the clip (a rule
            whose source has none, e.g. KL-Cov, arXiv:2505.22617).
        beta, ref_logprobs: k3 KL to a frozen reference; kl is reported whenever ref_logprobs is given.
        aggregation, max_len: ``AGGREGATIONS`` key ("grpo" | "dapo" | "dr_grpo") and dr_grpo's constant
            (default T).
        loss_mask: tokens in the aggregation's denominator (default ``mask``): Lopti passes the full mask
            so each phase is normalised like the single GRPO update (the AR-Lopti code, arXiv:2505.12929).
        clip_ratio_c: dual-clip c > 1 (arXiv:1912.09729; verl 3, AR-Lopti's scripts 10), 0 = off: a huge
            ratio on a bad token cannot blow up the loss.
        is_weight: the rollout correction's weight (``rollout_correction.correction_weights``); None = 1.
    """
    agg, weights, loss_mask, advantages = _checked_inputs(
        logprobs,
        old_logprobs=old_logprobs,
        advantages=advantages,
        mask=mask,
        loss_mask=loss_mask,
        ref_logprobs=ref_logprobs,
        weights=weights,
        beta=beta,
        is_weight=is_weight,
        aggregation=aggregation,
        clip_ratio_c=clip_ratio_c,
    )
    valid, lp, log_ratio, adv = _on_mask(logprobs, old_logprobs, advantages, mask, weights)
    ratio = log_ratio.exp()  # [N, T]
    clip = {"eps_low": eps_low, "eps_high": eps_high, "ppo_clip": ppo_clip, "clip_ratio_c": clip_ratio_c}
    pg, clipped = _policy_term(ratio, adv, weights=weights, is_weight=is_weight, valid=valid, clip=clip)
    kl = _reference_kl(lp, ref_logprobs, valid)  # [N, T] or None
    per_token = _per_token_loss(
        pg,
        kl,
        beta=beta,
        weights=weights,
        log_ratio=log_ratio,
        old_logprobs=old_logprobs,
        is_weight=is_weight,
        valid=valid,
    )
    norm = loss_mask.to(per_token.dtype)  # [N, T]
    loss = agg(per_token, norm, max_len)
    pg_loss = agg(torch.where(valid, pg, 0.0), norm, max_len)
    metrics = _metrics(
        ratio, log_ratio, adv=adv, clipped=clipped, kl=kl, mask=mask, weights=weights, pg_loss=pg_loss
    )
    return LossOutput(
        loss=loss, per_token_loss=per_token, ratio=ratio, clipped=clipped, kl=kl, metrics=metrics
    )


def _policy_term(ratio, adv, *, weights, is_weight, valid, clip: dict) -> tuple[Tensor, Tensor]:
    """(pg_t = -s_t * loss_weight * w_t, clipped & valid), both [N, T]: the clipped surrogate s_t of the
    weighted ratio u = r * ratio_weight. `clip`: clipped_surrogate's keywords."""
    obj, clipped = clipped_surrogate(ratio * _one(weights.ratio_weight), adv, **clip)  # [N, T]
    return -obj * _one(weights.loss_weight) * _one(is_weight), clipped & valid


def _per_token_loss(pg, kl, *, beta, weights, log_ratio, old_logprobs, is_weight, valid) -> Tensor:
    """loss_t = pg_t + w_t * kl_cov_coef * |log r| + beta * k3, zero off the mask ([N, T]). w_t is the
    rollout correction's importance weight (``is_weight``, 1 without one): as in TRL 1.16 the policy term
    and KL-Cov's penalty carry it and the reference KL does not; a masked token (w_t = 0) stays in the
    aggregation's denominator. |log r| below fp32 rounding counts as 0, so an on-policy token gets no
    random-sign KL-Cov push."""
    per_token = pg + _kl_cov_penalty(weights, log_ratio, old_logprobs) * _one(is_weight)  # [N, T]
    return torch.where(valid, per_token + (beta * kl if kl is not None else 0.0), 0.0)  # [N, T]


def _on_mask(logprobs, old_logprobs, advantages, mask, weights) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(valid, log pi, log r, A') [N, T] each, zero off the mask. Off-mask values may be -inf/NaN
    (padding); they are zeroed before any op so that no NaN reaches the gradient."""
    valid = mask > 0  # [N, T]
    lp = torch.where(valid, logprobs, 0.0)  # [N, T]
    log_ratio = lp - torch.where(valid, old_logprobs.detach(), 0.0)  # [N, T]
    adv = torch.where(valid, advantages, 0.0) * _one(weights.advantage_weight)  # [N, T]
    return valid, lp, log_ratio, adv


def _reference_kl(lp: Tensor, ref_logprobs: Tensor | None, valid: Tensor) -> Tensor | None:
    """[N, T] k3 KL to the reference on the loss tokens (0 elsewhere); None without ref_logprobs."""
    if ref_logprobs is None:
        return None
    return torch.where(valid, k3_kl(lp, torch.where(valid, ref_logprobs.detach(), 0.0)), 0.0)


def _kl_cov_penalty(weights: TokenWeights, log_ratio: Tensor, old_logprobs: Tensor) -> Tensor | float:
    """[N, T] KL-Cov's kl_cov_coef * |log r| (arXiv:2505.22617), 0 for rules without it."""
    if weights.kl_cov_coef is None:
        return 0.0
    return weights.kl_cov_coef.detach() * _above_rounding(log_ratio, old_logprobs)


# fp32 log-probs of size |L| carry rounding of about |L| * 2^-23; a |log r| below a few of those is noise.
ROUNDING = 8 * torch.finfo(torch.float32).eps


def _above_rounding(log_ratio: Tensor, old_logprobs: Tensor) -> Tensor:
    """|log r| where it exceeds fp32 rounding of the log-probs (ROUNDING * (1 + |log pi_old|)), else 0
    (with no gradient). [N, T] -> [N, T]."""
    tol = ROUNDING * (1.0 + old_logprobs.detach().abs().nan_to_num(0.0))  # [N, T]
    a = log_ratio.abs()  # [N, T]
    return torch.where(a > tol, a, torch.zeros_like(a))


@torch.no_grad()
def _metrics(ratio, log_ratio, *, adv, clipped, kl, mask, weights: TokenWeights, pg_loss) -> dict[str, float]:
    """Scalar summaries over the loss tokens (one host sync)."""
    m = (mask > 0).to(ratio.dtype)  # [N, T]
    n = m.sum().clamp_min(1.0)
    mean = lambda x: (torch.where(m > 0, x.to(m.dtype), 0.0)).sum() / n  # noqa: E731
    weight = weights.effective(m)  # [N, T]
    values = {
        "clip_frac": mean(clipped),
        "clip_frac_low": mean(clipped & (adv < 0)),  # ratio pushed below 1 - eps_low
        "clip_frac_high": mean(clipped & (adv > 0)),  # ratio pushed above 1 + eps_high
        "ratio_mean": mean(ratio),
        "approx_kl": mean(-log_ratio),  # E_old[log pi_old - log pi_theta]
        "kl_mean": mean(kl) if kl is not None else torch.zeros((), device=m.device),
        "weight_mean": mean(weight.expand_as(m)),
        "pg_loss": pg_loss.detach(),
        "n_tokens": m.sum(),
    }
    flat = torch.stack([v.to(torch.float64).reshape(()) for v in values.values()]).cpu().tolist()
    return dict(zip(values, flat))
