"""A TRL step's scalars from tokengrad's own hooks and the trainer's state, on every step whatever TRL's
`logging_steps` / `logging_strategy`: TRL's log dictionary is only joined where TRL logs (logs.py).

- `loss`: the value each `training_step` returns, summed over an optimizer update's micro-batches (what
  the Trainer adds to the loss it logs), then the mean over the step's updates. A NaN/inf stays as it is
  (the Trainer's `logging_nan_inf_filter` replaces it in its own log; here it is the pathology).
- `lr`: the trainer's learning rate at each optimizer update (read after `optimizer.step`, before the
  scheduler moves it), the mean over the step's updates.
- `reward_mean`, `reward_std`, `reward_<function>_mean`, `reward_<function>_std`: over the whole
  generation batch (every process's completions, as TRL scores them), unscorable completions left out;
  std with Bessel's correction, as TRL's.
- `kl`: the k3 estimator exp(r - l) - (r - l) - 1 of KL(pi || pi_ref) per token (l = log pi, r = log
  pi_ref; DeepSeekMath, arXiv 2402.03300 eq. 4), its mean over each micro-batch's loss tokens, then over
  the step's micro-batches (times the importance ratio with `use_bias_correction_kl`, as the loss uses it).
- `clip_frac`: per micro-batch the share of loss tokens (sequences, at sequence-level importance
  sampling) whose clip was active, then the mean over the step's micro-batches: TRL's `clip_ratio/
  region_mean` (`cispo_clip_ratio` for cispo).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from tokengrad.integrations.trl.loss import importance_weights


class StepValues:
    """The running scalars of one open step; `update()` and `micro_batch()` return what to log so far."""

    def __init__(self):
        self.update_losses: list[float] = []
        self.lrs: list[float] = []
        self.kls: list[float] = []
        self.clip_fracs: list[float] = []

    def update(self, loss: float, lr: float | None) -> dict[str, float]:
        """One optimizer update ended in this step with `loss` (its micro-batches' sum) at `lr`."""
        self.update_losses.append(float(loss))
        if lr is not None:
            self.lrs.append(float(lr))
        out = {"loss": _mean(self.update_losses)}
        return {**out, "lr": _mean(self.lrs)} if self.lrs else out

    def micro_batch(self, kl: float | None, clip_frac: float | None) -> dict[str, float]:
        """One tracked micro-batch's KL and clip share (None: the loss has none)."""
        if kl is not None:
            self.kls.append(kl)
        if clip_frac is not None:
            self.clip_fracs.append(clip_frac)
        out = {"kl": _mean(self.kls)} if self.kls else {}
        return {**out, "clip_frac": _mean(self.clip_fracs)} if self.clip_fracs else out


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def reward_scalars(rewards_per_func: torch.Tensor, weights: torch.Tensor, names: list[str]) -> dict:
    """The generation batch's reward statistics: total (TRL's weighted sum) and per reward function.

    Args:
        rewards_per_func: [B_all, F] every process's rewards, NaN where a function could not score a row.
        weights: [F] TRL's reward_weights. names: the F columns' names (already column-safe).
    """
    per_func = rewards_per_func.detach().double().cpu().numpy()  # [B_all, F]
    total = np.nansum(per_func * weights.detach().double().cpu().numpy()[None, :], axis=1)  # [B_all]
    total[np.isnan(per_func).all(1)] = np.nan  # unscorable rows
    out = {"reward_mean": _nan_mean(total), "reward_std": _nan_std(total)}
    for i, name in enumerate(names):
        out[f"reward_{name}_mean"] = _nan_mean(per_func[:, i])
        out[f"reward_{name}_std"] = _nan_std(per_func[:, i])
    return out


def _nan_mean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def _nan_std(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.std(ddof=1)) if x.size > 1 else math.nan


def k3_kl(logps: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor, ratio=None) -> float:
    """Mean k3 KL over the loss tokens of one micro-batch (arXiv 2402.03300 eq. 4).

    Args:
        logps, ref: [B, T] log pi and log pi_ref. mask: [B, T] loss mask.
        ratio: [B, T] or [B, 1] importance ratio the KL term is multiplied by, or None.
    """
    d = ref.detach().double() - logps.detach().double()  # [B, T]
    kl = d.exp() - d - 1.0  # [B, T]
    if ratio is not None:
        kl = kl * ratio.double()
    m = mask.double()
    return float((kl * m).sum() / m.sum().clamp(min=1.0))


def clip_share(clipped: torch.Tensor, mask: torch.Tensor, level: str) -> float:
    """Share of a micro-batch's loss tokens (sequences at sequence level) whose clip was active.

    Args:
        clipped: [B, T] bool, one flag per sequence repeated at sequence level. mask: [B, T] loss mask.
    """
    if level == "sequence":  # TRL's metric counts sequences there
        return float(clipped[:, 0].double().mean())
    m = mask.double()
    return float((clipped.double() * m).sum() / m.sum().clamp(min=1.0))


def micro_batch_values(
    trainer, clip, logps, inputs, *, loss_mask, clipped
) -> tuple[float | None, float | None]:
    """(kl, clip share) of one tracked micro-batch; kl None without a reference model (beta = 0)."""
    ref = inputs.get("ref_per_token_logps")
    kl = None
    if ref is not None and float(getattr(trainer, "beta", 0.0) or 0.0) != 0.0:
        old = inputs.get("old_per_token_logps")
        ratio = None
        if getattr(trainer.args, "use_bias_correction_kl", False):  # TRL >= 1.14's option
            old = logps.detach() if old is None else old
            ratio = importance_weights(logps, old, loss_mask, clip.level)
        kl = k3_kl(logps, ref, loss_mask, ratio)
    share = None if clipped is None else clip_share(clipped, loss_mask, clip.level)
    return kl, share
