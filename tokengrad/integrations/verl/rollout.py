"""The rollout engine's side of a verl actor update: the engine's per-token log-probs, the IS weight verl's
loss applied and the masks that removed a token, read from verl's own tensors at the loss entry, and the
step metrics of the gap (tokengrad.objective.rollout_correction) over the step's tokens.

verl 0.9 (verl/trainer/ppo/rollout_corr_helper.py) computes, on the driver, from d = old_log_probs -
rollout_log_probs over `response_mask`: the IS weights `rollout_is_weights` (token or sequence level,
truncated, or IcePop: 0 outside [lower, upper]) that the policy loss multiplies in, and a rejection mask
(`rollout_rs`) that it writes back into `response_mask`. The micro-batch reaching `ppo_loss` carries
`rollout_log_probs` (when the rollout computed them) next to `old_log_probs` and the weights; the tokens
rejection sampling removed are no longer in its `response_mask`, so the driver-side wrapper
(`wrap_rollout_correction`) keeps them as a boolean batch field, RS_KEY, that travels with the batch.

Bypass mode (algorithm.rollout_correction.bypass_mode, and verl's fully-async trainer) sets old_log_probs =
rollout_log_probs: the trainer's log pi_old is never computed and the gap is unknown. There the recorded
old_logprob is verl's (the engine's) and rollout_logprob stays null, unless the mismatch probe
(tokengrad.integrations.verl.probe) put the trainer's own log-probs into the batch as PROBE_KEY.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokengrad import schema
from tokengrad.objective import rollout_correction as rc

ROLLOUT_KEY = "rollout_log_probs"
RS_KEY = "tokengrad_rs_rejected"  # [B, R] bool: tokens verl's rejection sampling removed from response_mask
PROBE_KEY = "tokengrad_probe_log_probs"  # [B, R] the trainer's log pi_old from the mismatch probe (bypass)
ENTRY_KEYS = ("responses", ROLLOUT_KEY, RS_KEY, PROBE_KEY)  # what the loss entry hands the recording
_BIT = {name: 1 << i for i, name in enumerate(schema.MASK_REASONS)}


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
    """verl's bypass mode copies rollout_log_probs into old_log_probs: equal on every loss token."""
    return bool(mask.any()) and same(old[mask], rollout[mask])


def micro_batch(entry: dict, old_log_prob, response_mask, rollout_is_weights) -> MicroBatch:
    """The rollout tensors of one loss call. `entry`: the loss entry's batch fields (ENTRY_KEYS, [B, T]);
    old_log_prob, response_mask [B, T], rollout_is_weights [B, T] or None: what verl's policy loss got."""
    rs = entry.get(RS_KEY)
    rs = None if rs is None else rs.bool()
    mask = response_mask.bool() if rs is None else response_mask.bool() | rs  # [B, T]
    old, rollout = old_log_prob.detach(), entry.get(ROLLOUT_KEY)
    if rollout is not None and is_bypass(old, rollout, mask):
        probe = entry.get(PROBE_KEY)
        old, rollout = (old, None) if probe is None else (probe.to(old.dtype), rollout)
    w = None if rollout_is_weights is None else rollout_is_weights.detach()
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


def wrap_rollout_correction() -> None:
    """Wrap verl's driver-side `compute_rollout_correction_and_add_to_batch` so the tokens its rejection
    sampling removes from `response_mask` stay known: a boolean field RS_KEY [B, R] joins the batch (only
    when `rollout_rs` is set). verl's trainers look the function up in its module at call time or import
    it after `import verl` has loaded the plugin, so they call the wrapped one."""
    import functools

    from verl.trainer.ppo import rollout_corr_helper as helper

    orig = helper.compute_rollout_correction_and_add_to_batch
    if getattr(orig, "_tokengrad", False):
        return

    @functools.wraps(orig)
    def compute_rollout_correction_and_add_to_batch(batch, rollout_corr_config, *a, **k):
        before = batch.batch["response_mask"].bool().clone()  # [B, R]
        out, metrics = orig(batch, rollout_corr_config, *a, **k)
        if rollout_corr_config.get("rollout_rs", None) is not None:
            out.batch[RS_KEY] = before & ~out.batch["response_mask"].bool()
        return out, metrics

    compute_rollout_correction_and_add_to_batch._tokengrad = True
    helper.compute_rollout_correction_and_add_to_batch = compute_rollout_correction_and_add_to_batch
