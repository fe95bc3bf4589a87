"""The rollout engine's side of a TRL run: the sampler's per-token log-probs TRL hands the loss, the IS weight
its loss applied and the masks that removed a token's gradient, all read from TRL's own tensors; the step
metrics of the gap (tokengrad.objective.rollout_correction) on the generation batch TRL's metrics describe.

TRL 1.16 (grpo_trainer.py): `_generate_and_score_completions` returns `sampling_per_token_logps` (vLLM,
continuous batching or a `rollout_func`) and, with `use_vllm` and the correction on,
`importance_sampling_ratio` ([B, T] in token modes, [B, 1] in sequence modes; 0 where a mask mode removed
the token or sequence), which
`_compute_loss` multiplies into every token's loss term. `_compute_loss` also calls `get_off_policy_mask`
([B, 1], 0 = dropped) with `off_policy_mask_threshold` and `get_high_entropy_mask` ([B, T], False = dropped)
with `top_entropy_quantile`: the recording captures their return values.
"""

from __future__ import annotations

import torch

from tokengrad.objective import rollout_correction as rc

_BIT = rc.MASK_BIT


def loss_mask(inputs: dict) -> torch.Tensor:
    """[B, T] TRL's loss mask: completion_mask times tool_mask."""
    m = inputs["completion_mask"]
    return m * inputs["tool_mask"] if torch.is_tensor(inputs.get("tool_mask")) else m


def is_mask_reason(trainer) -> str | None:
    """The masks-reason of TRL's IS correction, None when it truncates (or is off)."""
    if not (trainer.use_vllm and trainer.vllm_importance_sampling_correction):
        return None
    return rc.MASK_REASON.get(trainer.vllm_importance_sampling_mode)


def mask_codes(trainer, inputs: dict, captured: dict, like: torch.Tensor) -> torch.Tensor | None:
    """[B, T] bit codes (schema.MASK_REASONS) of the masks that removed each loss token's gradient in this
    micro-batch; None when TRL applied none. `captured`: TRL's off_policy_mask / entropy_mask tensors."""
    m = loss_mask(inputs).bool()
    code = torch.zeros_like(like, dtype=torch.int32)
    applied = False
    reason, w = is_mask_reason(trainer), inputs.get("importance_sampling_ratio")
    if reason is not None and torch.is_tensor(w):
        code |= rc.zero_weight_codes(w, m, reason)
        applied = True
    if "off_policy_mask" in captured:
        code |= torch.where(
            captured["off_policy_mask"].expand_as(code) == 0, _BIT["off_policy_mask"], 0
        ).int()
        applied = True
    if "entropy_mask" in captured:
        code |= torch.where(~captured["entropy_mask"].bool(), _BIT["entropy_mask"], 0).to(code.dtype)
        applied = True
    return torch.where(m, code, 0) if applied else None


def is_weights(inputs: dict, like: torch.Tensor) -> torch.Tensor | None:
    """[B, T] the IS weight TRL's loss multiplied each token's term by (its own tensor, broadcast)."""
    w = inputs.get("importance_sampling_ratio")
    return w.expand_as(like).float() if torch.is_tensor(w) else None


def step_metrics(trainer, out: dict) -> dict[str, float]:
    """The gap and IS-weight metrics of one generation batch (what TRL's sampling/* metrics describe)."""
    rollout, old = out.get("sampling_per_token_logps"), out.get("old_per_token_logps")
    if rollout is None or old is None:
        return {}
    m = loss_mask(out)
    metrics = rc.gap_metrics(old, rollout, m)
    w = out.get("importance_sampling_ratio")
    if torch.is_tensor(w):
        metrics.update(rc.weight_metrics(w, m))
        if is_mask_reason(trainer) is not None:
            metrics.update(rc.masked_counts(w, m))
    return metrics


def sample_columns(out: dict, rows: slice) -> dict[str, list[float]]:
    """Per completion: TRL's log sequence ratio (the sum of the gaps) and the mean per-token gap."""
    rollout, old = out.get("sampling_per_token_logps"), out.get("old_per_token_logps")
    if rollout is None or old is None:
        return {}
    total, mean = rc.sequence_gaps(old[rows], rollout[rows], loss_mask(out)[rows])
    return {"rollout_seq_log_ratio": total.tolist(), "rollout_gap_mean": mean.tolist()}
