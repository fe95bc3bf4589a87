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

from tokengrad.integrations import host

ROLLOUT_KEY = "rollout_log_probs"
RS_KEY = "tokengrad_rs_rejected"  # [B, R] bool: tokens verl's rejection sampling removed from response_mask
PROBE_KEY = "tokengrad_probe_log_probs"  # [B, R] the trainer's log pi_old from the mismatch probe (bypass)
ENTRY_KEYS = ("responses", ROLLOUT_KEY, RS_KEY, PROBE_KEY)  # what the loss entry hands the recording


def micro_batch(entry: dict, old_log_prob, response_mask, rollout_is_weights) -> host.MicroBatch:
    """The rollout tensors of one verl loss call. `entry`: the loss entry's batch fields (ENTRY_KEYS,
    [B, T]); old_log_prob, response_mask [B, T], rollout_is_weights [B, T] or None: what verl's policy loss
    got."""
    return host.micro_batch(
        old_log_prob,
        response_mask,
        rollout_is_weights,
        rollout=entry.get(ROLLOUT_KEY),
        rs=entry.get(RS_KEY),
        probe=entry.get(PROBE_KEY),
    )


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
