"""Group-relative advantages and the DAPO dynamic-sampling group filter.

    from tokengrad.objective.advantages import compute_advantages, keep_groups
    adv = compute_advantages(rewards)               # rewards [B, G] -> [B, G]
    keep = keep_groups(rewards)                     # [B] bool, False for groups with one reward value

Scales are a registry (``ADVANTAGE_SCALES``): name -> fn(centred [B, G], rewards [B, G], eps) -> [B, G].
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from tokengrad.registry import Registry

ADVANTAGE_SCALES: Registry[Callable[[Tensor, Tensor, float], Tensor]] = Registry("advantage scale")


def register_advantage_scale(name: str) -> Callable:
    """Decorator: ``ADVANTAGE_SCALES[name] = fn(centred [B, G], rewards [B, G], eps) -> [B, G]``."""
    return ADVANTAGE_SCALES.register(name)


@register_advantage_scale("group")
def _scale_group(centred: Tensor, rewards: Tensor, eps: float) -> Tensor:
    """Divide by the group's unbiased std + eps (GRPO, arXiv:2402.03300; verl's eps 1e-6).

    A group of size 1 has no std (Bessel's correction divides by 0); its centred value is 0 anyway,
    so it is divided by 1 to keep the advantage 0 rather than NaN."""
    if rewards.shape[1] < 2:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)  # [B, G]


@register_advantage_scale("batch")
def _scale_batch(centred: Tensor, rewards: Tensor, eps: float) -> Tensor:
    """Divide by the std of all rewards of the batch + eps (TRL's scale_rewards="batch")."""
    if rewards.numel() < 2:
        return centred
    return centred / (rewards.std() + eps)  # [B, G]


@register_advantage_scale("none")
def _scale_none(centred: Tensor, rewards: Tensor, eps: float) -> Tensor:
    """No std division: Dr. GRPO (arXiv:2503.20783) removes it as a difficulty bias."""
    return centred


def _check_rewards(rewards: Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [B, G] (prompts x group size), got shape {list(rewards.shape)}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards contain NaN or inf")


def compute_advantages(rewards: Tensor, scale: str = "group", eps: float = 1e-6) -> Tensor:
    """Group-relative advantages A_i = (R_i - mean_group R) / scale.

    Args:
        rewards: [B, G] float, one row per prompt, one column per sampled completion.
        scale: a key of ``ADVANTAGE_SCALES``: "group" (GRPO), "batch" or "none" (Dr. GRPO).
        eps: added to the std.
    Returns:
        [B, G] advantages; a group of size 1 or with all-equal rewards gets 0.
    """
    scale_fn = ADVANTAGE_SCALES[scale]  # unknown names raise, listing the known ones
    _check_rewards(rewards)
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    centred = rewards - rewards.mean(dim=1, keepdim=True)  # [B, G]
    return scale_fn(centred, rewards, eps)


def keep_groups(rewards: Tensor) -> Tensor:
    """DAPO dynamic sampling (arXiv:2503.14476): [B] bool, False for a group whose rewards are all
    equal (all correct, all wrong, or a single completion), since its advantages are all 0."""
    _check_rewards(rewards)
    return rewards.amax(dim=1) > rewards.amin(dim=1)  # [B]
