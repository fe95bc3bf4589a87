"""Which tokens TRL's clip removed: the `clipped` column of a TRL recording, by TRL's own definition.

`GRPOTrainer._compute_loss` (trl 1.16) reports the clip through its metrics, never per token; this module
evaluates the same tests on the same tensors so that the mean of `clipped` over a micro-batch's loss tokens
is TRL's metric for it:

- PPO-clipped losses (grpo, bnpo, dr_grpo, dapo, luspo), metric `clip_ratio/region_mean`: with the
  importance weight r (per token, or exp of the masked mean log-ratio per sequence under
  importance_sampling_level="sequence", GSPO arXiv 2507.18071) and TRL's two-sided cap r <- min(r, delta)
  when `delta` is set (INTELLECT-2), a token is clipped when r < 1 - eps_low and A < 0, or r > 1 + eps_high
  and A > 0: exactly where min(r A, clip(r) A) takes the constant branch.
- cispo (arXiv 2506.13585), metric `cispo_clip_ratio`: r > eps_high and A > 0, where the detached weight
  min(r, eps_high) caps the update.

sapo and vespo have no clip (a smooth gate, a sequence weight): their `clipped` stays null.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokengrad.registry import Registry

CLIP_DEFINITIONS: Registry = Registry("TRL clip definition")  # loss_type -> fn(r, adv, ClipSettings)
PPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# TRL 1.16's loss types: coef (autograd) is exact for each; `clipped` is null for those without a clip
LOSS_TYPES = (*PPO_LOSS_TYPES, "cispo", "sapo", "vespo")


def check_loss_type(loss_type: str) -> None:
    """TRL checks `loss_type` only when the first loss is computed, after generation: refuse it at attach."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"unknown TRL loss_type {loss_type!r}; attach() records these: {list(LOSS_TYPES)}")


@dataclass(frozen=True)
class ClipSettings:
    """The trainer's clip parameters, read once at attach."""

    loss_type: str
    eps_low: float
    eps_high: float
    level: str  # importance_sampling_level: "token" or "sequence"
    delta: float | None = None

    @classmethod
    def of(cls, trainer) -> "ClipSettings":
        return cls(
            loss_type=trainer.loss_type,
            eps_low=float(trainer.epsilon_low),
            eps_high=float(trainer.epsilon_high),
            level=trainer.importance_sampling_level,
            delta=getattr(trainer.args, "delta", None),
        )


def importance_weights(
    logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """TRL's coef_1: exp(log pi - log pi_old) per token [B, T], or per sequence [B, 1] of the masked mean."""
    log_ratio = logps.detach() - old.detach()  # [B, T]
    if level == "sequence":
        m = mask.to(log_ratio.dtype)
        return ((log_ratio * m).sum(-1) / m.sum(-1).clamp(min=1.0)).unsqueeze(-1).exp()  # [B, 1]
    return log_ratio.exp()  # [B, T]


def ppo_clipped(r: torch.Tensor, adv: torch.Tensor, cfg: ClipSettings) -> torch.Tensor:
    """The constant branch of min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), as TRL's region metric."""
    if cfg.delta is not None:  # TRL caps r before it tests the clip, so a capped ratio is not "high clipped"
        r = r.clamp(max=cfg.delta)
    return ((r < 1 - cfg.eps_low) & (adv < 0)) | ((r > 1 + cfg.eps_high) & (adv > 0))


def cispo_clipped(r: torch.Tensor, adv: torch.Tensor, cfg: ClipSettings) -> torch.Tensor:
    """min(r, eps_high) is the cap: r above it with A > 0."""
    return (r > cfg.eps_high) & (adv > 0)


for _name in PPO_LOSS_TYPES:
    CLIP_DEFINITIONS.add(_name, ppo_clipped)
CLIP_DEFINITIONS.add("cispo", cispo_clipped)


def clipped_tokens(
    cfg: ClipSettings, logps: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor | None:
    """[B, T] bool: TRL's clip removed the token's policy gradient (None for loss types without a clip).

    Args:
        logps, old: [B, T] log pi_theta and log pi_old, as `_compute_loss` uses them.
        adv: [B] or [B, T] advantages.
        mask: [B, T] TRL's loss mask (completion_mask times tool_mask).
    """
    fn = CLIP_DEFINITIONS.get(cfg.loss_type)
    if fn is None:
        return None
    r = importance_weights(logps, old, mask, cfg.level)  # [B, T] or [B, 1]
    a = adv.detach().unsqueeze(1) if adv.dim() == 1 else adv.detach()  # [B, 1] or [B, T]
    return fn(r, a, cfg).expand_as(logps)  # [B, T]
