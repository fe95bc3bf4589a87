"""The built-in trainer's rollout correction (config `rollout_correction`, TRL 1.16's
`vllm_importance_sampling_mode` with its names and semantics): the importance-sampling weight of each
loss token, taken once per step from log pi_old and the sampler's log-probs, and what the run records of
it, in the same columns as the TRL attach.

    corr = correction_of(cfg)                       # None when rollout_correction = "off"
    b = with_weights(b, corr)                       # b.is_weights: [N, T] or [N, 1]
    st.log(**step_metrics(b, corr))                 # the gap and IS-weight metrics of all ranks
    st.track(..., **token_columns(b, rows, phase, corr))

The math is tokengrad.objective.rollout_correction (TIS/MIS: Yao et al. 2025; TRL grpo_trainer.py
~L2660-2705); the loss multiplies each token's policy term by the weight (tokengrad.objective.loss).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tokengrad.objective import rollout_correction as rc
from tokengrad.train import distributed as dist
from tokengrad.train.batch import Batch


def correction_of(cfg) -> rc.RolloutCorrection | None:
    """The config's correction (`rollout_correction`, `_clip_max`, `_clip_min`); None when it is off.
    A clip_min of 0 is no lower bound (TRL's None): every weight is > 0."""
    if cfg.rollout_correction == "off":
        return None
    lo = cfg.rollout_correction_clip_min or None
    return rc.RolloutCorrection(cfg.rollout_correction, cfg.rollout_correction_clip_max, lo)


def with_weights(b: Batch | None, corr: rc.RolloutCorrection | None) -> Batch | None:
    """`b` with `is_weights` (TRL's importance_sampling_ratio: [N, T] in token modes, [N, 1] in sequence
    modes, 0 where a mask mode removed the token); `b` unchanged without a correction."""
    if b is None or corr is None:
        return b
    return b._replace(is_weights=rc.correction_weights(b.old_logprobs, b.rollout_logprobs, b.loss_mask, corr))


def step_metrics(b: Batch | None, corr: rc.RolloutCorrection | None) -> dict[str, float]:
    """The step's gap metrics (rollout_mismatch, _max, _p99, KL k1/k3, chi^2, n_rollout_nan) and, with a
    correction, the applied weights' min / mean / max, ESS and masked counts, over the loss tokens of
    every rank: the columns the TRL attach fills from TRL's tensors."""
    empty = torch.zeros(0, 0)
    parts = [empty, empty, empty] if b is None else [b.old_logprobs, b.rollout_logprobs, b.loss_mask]
    if corr is not None:
        parts.append(torch.zeros(0, int(corr.sequence_level)) if b is None else b.is_weights)
    old, rollout, mask, *w = dist.gather_rows([p.detach().float().cpu() for p in parts])
    metrics = rc.gap_metrics(old, rollout, mask)
    if corr is not None and mask.numel():
        metrics.update(rc.weight_metrics(w[0], mask))
        if corr.masks:
            metrics.update(rc.masked_counts(w[0], mask))
    return metrics


def token_columns(b: Batch, rows: Tensor, loss_mask: Tensor, corr: rc.RolloutCorrection | None) -> dict:
    """`StepRecorder.track` keywords of the rows `rows`: the applied weight per token and, in a mask mode,
    the masks-reason code of every loss token (`loss_mask`, [n, T]) it zeroed."""
    if corr is None or b.is_weights is None:
        return {}
    w = b.is_weights[rows].expand_as(loss_mask)  # [n, T]
    out = {"is_weights": w}
    if corr.mask_reason is not None:
        out["mask_codes"] = rc.zero_weight_codes(w, loss_mask, corr.mask_reason)
    return out


def sample_columns(b: Batch | None, in_update: Tensor) -> dict[str, list[float]]:
    """Per generated row (samples-table order, `in_update` [n] bool): TRL's log sequence ratio sum_t d and
    the mean gap over the row's scored tokens; NaN for rows outside the update batch."""
    n = int(in_update.numel())
    total, mean = [math.nan] * n, [math.nan] * n
    if b is not None:
        seq, avg = rc.sequence_gaps(b.old_logprobs, b.rollout_logprobs, b.loss_mask)  # [N], [N]
        for i, s, a in zip(in_update.nonzero().squeeze(1).tolist(), seq.tolist(), avg.tolist()):
            total[i], mean[i] = s, a
    return {"rollout_seq_log_ratio": total, "rollout_gap_mean": mean}
