"""What the host integrations share (verl's plugin, OpenRLHF's actor; the TRL attach where it fits): the run
directory and token budget as environment variables, sample ids unique over ranks, and the rollout engine's
side of a loss call: the engine's per-token log-probs, the IS weight the host's loss applied and the masks
that removed a token, with the step metrics of the gap (tokengrad.objective.rollout_correction).

A host package imports this module, never another host's package.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tokengrad import schema
from tokengrad.objective import rollout_correction as rc

RUN_DIR_ENV = "TOKENGRAD_RUN_DIR"
BUDGET_ENV = "TOKENGRAD_TOKEN_BUDGET"  # token rows per step and rank (the Recorder's budget=K); unset = all
SAMPLE_STRIDE = 1 << 32  # sample_id = rank * SAMPLE_STRIDE + row: unique over ranks within a step
_BIT = {name: 1 << i for i, name in enumerate(schema.MASK_REASONS)}


def env_count(name: str) -> int | None:
    """A positive whole number from environment variable `name` (None when unset or empty)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"${name} must be a positive whole number, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"${name} must be a positive whole number, got {raw!r}")
    return value


def padded(x: torch.Tensor | None, width: int) -> torch.Tensor | None:
    """[B, width] of a padded or nested (jagged) [B, *] tensor, right-padded with 0 or cut to width."""
    if x is None:
        return None
    x = x.to_padded_tensor(0) if x.is_nested else x
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


@dataclass(kw_only=True)
class MicroBatch:
    """One loss call's rollout tensors, [B, T] each: what is recorded and what the step metrics pool."""

    old: torch.Tensor  # log pi_old as recorded: the trainer's, or verl's (= the engine's) in bypass
    rollout: torch.Tensor | None  # log mu; None where the gap is unknown (bypass without probe)
    mask: torch.Tensor  # bool, the loss tokens before rejection sampling (the rows recorded)
    is_weights: torch.Tensor | None  # rollout_is_weights as verl's loss applied them
    rs: torch.Tensor | None  # bool, removed by rejection sampling
    codes: torch.Tensor | None  # int32 schema.MASK_REASONS bits, None when no mask applied


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN equal to NaN (an engine's unscored tokens copied along)."""
    b = b.to(a.dtype)
    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def is_bypass(old: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor) -> bool:
    """Bypass mode (verl's, OpenRLHF without a separate pi_old) copies the engine's log-probs into the old
    log-probs: equal on every loss token, so the gap is unknown."""
    return bool(mask.any()) and same(old[mask], rollout[mask])


def micro_batch(
    old_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    is_weights: torch.Tensor | None,
    *,
    rollout: torch.Tensor | None = None,
    rs: torch.Tensor | None = None,
    probe: torch.Tensor | None = None,
) -> MicroBatch:
    """The rollout tensors of one loss call, [B, T] each: the old log-probs, the loss mask and the IS
    weights the host's loss got; the engine's log-probs `rollout`, the tokens rejection sampling removed
    from the mask `rs` and, in bypass mode, the trainer's own log-probs from a probe forward `probe`."""
    rs = None if rs is None else rs.bool()
    mask = response_mask.bool() if rs is None else response_mask.bool() | rs  # [B, T]
    old = old_log_prob.detach()
    if rollout is not None and is_bypass(old, rollout, mask):
        old, rollout = (old, None) if probe is None else (probe.to(old.dtype), rollout)
    w = None if is_weights is None else is_weights.detach()
    return MicroBatch(old=old, rollout=rollout, mask=mask, is_weights=w, rs=rs, codes=mask_codes(mask, w, rs))


def mask_codes(mask, weights, rs) -> torch.Tensor | None:
    """[B, T] bits of the masks that removed each token: an IS weight of 0 (IcePop) is is_sequence_mask when
    it zeroes all of the sequence's tokens, else is_token_mask; rs_mask for rejection sampling."""
    if weights is None and rs is None:
        return None
    code = torch.zeros(mask.shape, dtype=torch.int32, device=mask.device)
    if weights is not None:
        zero = (weights == 0) & mask  # [B, T]
        whole = (zero | ~mask).all(-1, keepdim=True) & mask.any(-1, keepdim=True)  # [B, 1]
        code |= torch.where(zero & whole, _BIT["is_sequence_mask"], 0).int()
        code |= torch.where(zero & ~whole, _BIT["is_token_mask"], 0).int()
    if rs is not None:
        code |= torch.where(rs & mask, _BIT["rs_mask"], 0).int()
    return code


def _cat(tensors: list[torch.Tensor], fill=0) -> torch.Tensor:
    """Stack [B_i, T_i] tensors along the batch, right-padding to the longest T."""
    width = max(t.shape[1] for t in tensors)
    return torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill) for t in tensors])


def step_metrics(parts: list[MicroBatch]) -> dict[str, float]:
    """The gap, IS-weight and rejection metrics over a step's micro-batches, on the tensors verl's
    compute_offpolicy_metrics / compute_is_metrics / compute_rollout_rejection_mask take (the loss tokens
    before rejection sampling)."""
    out: dict[str, float] = {}
    gap = [p for p in parts if p.rollout is not None]
    if gap:
        mask = _cat([p.mask for p in gap], False)
        out.update(rc.gap_metrics(_cat([p.old for p in gap]), _cat([p.rollout for p in gap]), mask))
    weighted = [p for p in parts if p.is_weights is not None]
    if weighted:
        mask = _cat([p.mask for p in weighted], False)
        out.update(rc.weight_metrics(_cat([p.is_weights for p in weighted]), mask))
        code = _cat([p.codes for p in weighted])
        is_bits = _BIT["is_sequence_mask"] | _BIT["is_token_mask"]
        out["is_masked_tokens"] = int(((code & is_bits) > 0).sum())
        out["is_masked_sequences"] = int(((code & _BIT["is_sequence_mask"]) > 0).any(-1).sum())
    rejected = [p for p in parts if p.rs is not None]
    if rejected:
        rs = _cat([p.rs & p.mask for p in rejected], False)  # [N, T]
        out["rs_masked_tokens"] = int(rs.sum())
        out["rs_masked_sequences"] = int(rs.any(-1).sum())
    return out
