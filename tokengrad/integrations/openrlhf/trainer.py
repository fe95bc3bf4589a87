"""The seams in OpenRLHF's policy actor: `ActorPPOTrainer.training_step` and the `PolicyLoss` it calls.

`wrap_trainer` wraps the trainer class's `training_step(experience, kl_ctl, step, loss_batch_info)`: during
the call the micro-batch's `Experience` is known (the loss receives only tensors), the trainer's
`actor_loss_fn` (built in `ActorPPOTrainer.__init__`) is wrapped on the instance on its first call, and
afterwards the step ends if the actor's optimizer stepped. The wrapped loss tracks the `log_probs` it is
given, the actor's per-token log-probs with graph, before calling OpenRLHF's own forward: an autograd hook
there reads coef = dL/dlog π of the actor's whole loss (the policy term in token or sequence mode and the
KL loss, built on the same tensor; the entropy bonus is built on the logits, not on log π). Nothing of the
loss is re-implemented: the IS weights it applied are read from its own forward (`applied_is_weights`).
"""

from __future__ import annotations

import contextvars
import copy
import functools

import torch

from tokengrad.integrations.openrlhf import recording as rec_mod

TESTED_OPENRLHF = ("0.11", "0.12")  # [lowest, first untested) minor versions; keep in step with the extra
_EXPERIENCE: contextvars.ContextVar = contextvars.ContextVar("tokengrad_openrlhf_experience", default=None)


def check_openrlhf_version(version: str) -> bool:
    from packaging.version import Version

    lo, hi = (Version(v).release[:2] for v in TESTED_OPENRLHF)
    return lo <= Version(version).release[:2] < hi


def wrap_trainer_module(module) -> None:
    """Wrap `module.ActorPPOTrainer` (openrlhf.trainer.ray.ppo_actor, right after it is imported)."""
    version = rec_mod.openrlhf_version()
    if version is not None and not check_openrlhf_version(version):
        raise RuntimeError(
            f"tokengrad's OpenRLHF integration is tested with openrlhf>={TESTED_OPENRLHF[0]},"
            f"<{TESTED_OPENRLHF[1]} but openrlhf {version} is installed; its training step or PolicyLoss "
            "may differ. Install tokengrad[openrlhf] with a tested OpenRLHF."
        )
    wrap_trainer(module.ActorPPOTrainer)


def wrap_trainer(cls) -> None:
    """Wrap `cls.training_step` (OpenRLHF's ActorPPOTrainer, or a class with its interface); idempotent."""
    orig = cls.training_step
    if getattr(orig, "_tokengrad", False):
        return

    @functools.wraps(orig)
    def training_step(self, experience, *args, **kwargs):
        _check_loss_scale(self)
        wrap_loss(self)
        token = _EXPERIENCE.set(experience)
        try:
            status = orig(self, experience, *args, **kwargs)
        finally:
            _EXPERIENCE.reset(token)
        rec = rec_mod.current()
        if rec is not None:
            rec.after_training_step(status)
        return status

    training_step._tokengrad = True
    cls.training_step = training_step


def _check_loss_scale(trainer) -> None:
    """fp16 is refused: DeepSpeed multiplies the loss by its dynamic loss scale before backward, so the
    gradient reaching log π (coef) would carry that scale (as in the TRL integration, docs/deepspeed.md)."""
    engine = getattr(getattr(trainer, "actor", None), "model", None)
    fp16 = getattr(engine, "fp16_enabled", None)
    if callable(fp16) and fp16():
        raise RuntimeError(
            "tokengrad cannot record coef under DeepSpeed fp16: the loss is multiplied by DeepSpeed's "
            "dynamic loss scale before backward. Train in bf16 (OpenRLHF's default) or fp32."
        )


def wrap_loss(trainer) -> None:
    """Replace `trainer.actor_loss_fn.forward` on the instance by the recording forward (once)."""
    loss_fn = trainer.actor_loss_fn
    if getattr(loss_fn.forward, "_tokengrad", False):
        return
    orig = loss_fn.forward
    temperature = getattr(getattr(trainer, "actor", None), "temperature", None)

    @functools.wraps(orig)
    def forward(
        log_probs,
        old_log_probs,
        advantages,
        action_mask=None,
        rollout_log_probs=None,
        dp_size=1,
        batch_num_tokens=None,
        global_batch_size=None,
    ):
        if torch.is_grad_enabled() and log_probs.requires_grad:
            _track(
                loss_fn,
                temperature,
                log_probs,
                old=old_log_probs,
                adv=advantages,
                action_mask=action_mask,
                rollout_lp=rollout_log_probs,
            )
        return orig(
            log_probs,
            old_log_probs,
            advantages,
            action_mask=action_mask,
            rollout_log_probs=rollout_log_probs,
            dp_size=dp_size,
            batch_num_tokens=batch_num_tokens,
            global_batch_size=global_batch_size,
        )

    forward._tokengrad = True
    loss_fn.forward = forward


def _track(loss_fn, temperature, log_probs, *, old, adv, action_mask, rollout_lp) -> None:
    experience = _EXPERIENCE.get()
    n, a = log_probs.shape
    if experience is None or getattr(experience, "sequences", None) is None:
        raise RuntimeError(
            "tokengrad's OpenRLHF loss needs the micro-batch's Experience (its `sequences`) from "
            "ActorPPOTrainer.training_step, wrapped by tokengrad.integrations.openrlhf.install; the loss was "
            "called outside it."
        )
    ids = experience.sequences[:, -a:]  # [B, A]: the actor's log-probs are those of the last A tokens
    if action_mask is None:
        action_mask = torch.ones_like(log_probs, dtype=torch.bool)
    weights = applied_is_weights(loss_fn, old, action_mask, rollout_lp)
    rec = rec_mod.recording(loss_fn, temperature)
    rec.track(
        log_probs,
        old_log_probs=old.detach(),
        advantages=adv.detach(),
        action_mask=action_mask.bool(),
        rollout_log_probs=rollout_lp,
        is_weights=weights,
        ids=ids,
    )


def applied_is_weights(loss_fn, old_log_probs, action_mask, rollout_log_probs) -> torch.Tensor | None:
    """[B, A] the IS factor OpenRLHF's PolicyLoss multiplies into each token's PPO loss (token or sequence
    level, mask or clip, gated by ratio, binary KL or TV), read from its own forward; None where it applies
    none (`is_correction_level="off"`, GSPO, or no rollout log-probs).

    At log π = log π_old the ratio is 1 and inside any clip, so with advantage A = -1 every token's PPO loss
    is exactly its IS factor w_t (dual clip does not act: it bounds only -min(...) below by c·A = -c < -1);
    summed over tokens (token-level aggregation with batch_num_tokens = 1, dp_size = 1), the loss is
    Σ_t w_t · mask_t, so -∂L/∂A_t = w_t · mask_t. w_t depends only on π_old, μ and the mask, never on
    log π or A, so these are the weights of the real call."""
    if (
        rollout_log_probs is None
        or getattr(loss_fn, "is_correction_level", "off") == "off"
        or getattr(loss_fn, "policy_loss_type", "ppo") != "ppo"
    ):
        return None
    probe = copy.copy(loss_fn)  # a shallow copy: the real module's settings stay as they are
    probe.token_level_loss = True
    old = old_log_probs.detach()
    with torch.enable_grad():
        adv = torch.full(old.shape, -1.0, dtype=old.dtype, device=old.device, requires_grad=True)  # [B, A]
        loss = type(loss_fn).forward(
            probe,
            old,
            old,
            adv,
            action_mask=action_mask,
            rollout_log_probs=rollout_log_probs.detach(),
            dp_size=1,
            batch_num_tokens=1.0,
            global_batch_size=None,
        )[0]
        (grad,) = torch.autograd.grad(loss, adv)
    return -grad  # [B, A]; 0 outside the action mask
