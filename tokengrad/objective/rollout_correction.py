"""The rollout engine's log-probs next to the trainer's: the importance-sampling corrections hosts apply and
the step metrics of the gap, as pure tensor functions shared by the TRL and verl integrations and the
built-in trainer.

mu is the distribution the engine sampled from (vLLM, SGLang, a bf16 or top-k-renormalised sampler),
pi_old the trainer's distribution at the same parameters. The PPO ratio factors as
log(pi_theta / mu) = log(pi_theta / pi_old) + log(pi_old / mu); the second term, d = log pi_old - log mu per
token, is the gap. Tokens the engine could not score carry NaN in mu (TRL #6166): every metric leaves them
out and counts them (`n_rollout_nan`).

Corrections (TRL 1.16 `vllm_importance_sampling_mode`, grpo_trainer.py ~L2660-2705; TIS/MIS, Yao et al.
2025 "Your efficient RL framework secretly brings you off-policy RL training"): the weight is exp(d) per
token, or exp(sum_t d) per sequence (TRL sums the gaps, it does not average them), with NaN gaps counted
as 0; `*_truncate` clamps it to [clip_min, clip_max], `*_mask` sets weights outside the interval to 0.

Metrics (verl 0.9 rollout_corr_helper.compute_offpolicy_metrics and compute_is_metrics; TRL's
sampling/* metrics): mean / max / p99 of |d|, k1 = E[log mu - log pi_old] and k3 = E[exp(d) - d - 1]
(both estimate KL(mu || pi_old) from tokens sampled from mu, Schulman 2020 "Approximating KL divergence"),
chi^2 per token E[exp(d)^2] - 1 and per sequence E[exp(sum_t d)^2] - 1, and for the applied weights w
min / mean / max and the effective sample size as verl reports it, (sum w)^2 / (n sum w^2), the share of
the n tokens the weighted sample is worth (multiply by n for Kish's (sum w)^2 / sum w^2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tokengrad import schema
from tokengrad.registry import Registry

SAFETY_BOUND = 20.0  # |log ratio| cap before exp in the chi^2 metrics, as verl's rollout_corr_helper
MODES: Registry = Registry("rollout correction mode")  # name -> fn(ratio, clip_min, clip_max)


@MODES.register("token_truncate")
@MODES.register("sequence_truncate")
def _truncate(ratio: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    return torch.clamp(ratio, min=lo, max=hi)


@MODES.register("token_mask")
@MODES.register("sequence_mask")
def _mask(ratio: torch.Tensor, lo: float | None, hi: float | None) -> torch.Tensor:
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    return ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)


@dataclass(frozen=True)
class RolloutCorrection:
    """An importance-sampling correction of the rollout gap, with TRL's names and semantics."""

    mode: str = "sequence_mask"
    clip_max: float | None = 3.0
    clip_min: float | None = None

    def __post_init__(self):
        MODES[self.mode]  # an unknown mode raises ValueError listing the known ones

    @property
    def sequence_level(self) -> bool:
        return self.mode.startswith("sequence")

    @property
    def masks(self) -> bool:
        return self.mode.endswith("mask")

    @property
    def mask_reason(self) -> str | None:
        """tokens.masked_by of a token this correction removed (schema.MASK_REASONS); None: truncation."""
        return MASK_REASON.get(self.mode)


# the masks-reason (schema.MASK_REASONS) of each masking mode
MASK_REASON = {"sequence_mask": "is_sequence_mask", "token_mask": "is_token_mask"}
MASK_BIT = {name: 1 << i for i, name in enumerate(schema.MASK_REASONS)}  # tokens.masked_by bit codes


def gap(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] d = log pi_old - log mu on loss tokens, 0 elsewhere and where mu is NaN (TRL's convention)."""
    return torch.nan_to_num((old.detach() - rollout.detach()) * mask, nan=0.0)


def raw_ratio(old, rollout, mask, sequence_level: bool) -> torch.Tensor:
    """exp(d) per token [B, T], or exp(sum_t d) per sequence [B, 1], before any truncation or mask."""
    d = gap(old, rollout, mask)
    return (d.sum(-1, keepdim=True) if sequence_level else d).exp()


def correction_weights(old, rollout, mask, corr: RolloutCorrection) -> torch.Tensor:
    """The weight multiplying each token's loss term: [B, T] (token modes) or [B, 1] (sequence modes).

    Args:
        old: [B, T] log pi_old; rollout: [B, T] log mu (NaN = not scored); mask: [B, T] loss mask.
    """
    return MODES[corr.mode](raw_ratio(old, rollout, mask, corr.sequence_level), corr.clip_min, corr.clip_max)


def zero_weight_codes(weights: torch.Tensor, mask: torch.Tensor, reason: str) -> torch.Tensor:
    """[B, T] int32: the bit of `reason` (MASK_BIT) on loss tokens whose weight ([B, T] or [B, 1]) is 0."""
    zero = (weights.detach().expand(mask.shape) == 0) & mask.bool()  # [B, T]
    return torch.where(zero, MASK_BIT[reason], 0).to(torch.int32)


def masked_counts(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, int]:
    """Loss tokens a mask mode set to weight 0, and sequences whose every loss token it zeroed."""
    m = mask.bool()
    zero = (weights.detach().expand(m.shape) == 0) & m  # [B, T]
    whole = (zero.sum(-1) == m.sum(-1)) & (m.sum(-1) > 0)  # [B]
    return {"is_masked_tokens": int(zero.sum()), "is_masked_sequences": int(whole.sum())}


def _scored(rollout: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return mask.bool() & ~torch.isnan(rollout)  # [B, T]


def gap_metrics(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """The gap's step metrics over the loss tokens the engine scored (NaN when there are none)."""
    ok = _scored(rollout, mask)  # [B, T]
    d = (old.detach() - rollout.detach()).double()  # [B, T]
    out = {"n_rollout_nan": int((mask.bool() & torch.isnan(rollout)).sum())}
    if not ok.any():
        return out
    x = d[ok]  # [K]
    safe = d.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    seq = (torch.where(ok, d, 0.0).sum(-1)).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B]
    out.update(
        rollout_mismatch=float(x.abs().mean()),
        rollout_mismatch_max=float(x.abs().max()),
        rollout_mismatch_p99=float(torch.quantile(x.abs(), 0.99)),
        rollout_kl_k1=float((-x).mean()),
        rollout_kl_k3=float((x.exp() - x - 1).mean()),
        rollout_chi2_token=float(safe[ok].exp().square().mean() - 1),
        rollout_chi2_seq=float((2 * seq).exp().mean() - 1),
    )
    return out


def weight_metrics(weights: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """min / mean / max of the applied weights as TRL logs them (over sequences for [B, 1] weights, over
    loss tokens for [B, T]) and verl's effective sample size (sum w)^2 / (n sum w^2) over loss tokens."""
    m = mask.bool()
    w = weights.detach().double()
    flat = w.flatten() if w.shape[-1] == 1 else w[m]
    per_token = w.expand(m.shape)[m]  # [K]
    if flat.numel() == 0:
        return {}
    sq = per_token.square().sum()
    return {
        "is_weight_min": float(flat.min()),
        "is_weight_mean": float(flat.mean()),
        "is_weight_max": float(flat.max()),
        "is_ess": float(per_token.sum().square() / (per_token.numel() * sq)) if sq > 0 else 0.0,
    }


def sequence_gaps(old, rollout, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sequence [B]: sum_t d (TRL 1.16's log sequence ratio) and the mean gap over its scored tokens
    (NaN for a sequence without any)."""
    n = _scored(rollout, mask).sum(-1)  # [B]
    total = gap(old, rollout, mask).sum(-1)  # [B]
    return total, torch.where(n > 0, total / n.clamp(min=1), math.nan)
