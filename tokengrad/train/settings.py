"""The trainer's config as each component's own settings: the one place that reads a TrainConfig for them.

    updates = update_of(cfg, policy, weighting=weighting_of(cfg), correction=None, max_len=256)
    rec = recorder_of(cfg, run_dir, model=model, tokenizer=tok, weighting=..., temperature=1.0, ...)

The components (GRPOUpdate and its Weighting, LossSettings and Schedule in tokengrad.train.updates; the
Recorder in tokengrad.record) take named plain values and never see the config, so they run the same under
the built-in trainer, a test or another loop.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from tokengrad.objective.rollout_correction import RolloutCorrection
from tokengrad.objective.weighting import get_weighting, rule_meta, rule_params
from tokengrad.record import Attribution, RunInfo
from tokengrad.record.buckets.whatif import WhatIf
from tokengrad.record.options import Doctor
from tokengrad.record.recorder import Recorder
from tokengrad.record.store.claim import in_bucket
from tokengrad.train.config import TrainConfig
from tokengrad.train.updates import GRPOUpdate, LossSettings, Policy, Schedule, Weighting


def weighting_of(cfg: TrainConfig) -> Weighting:
    """The rule and its parameters; a rule that takes the clip range gets the loss's own."""
    shared = {k: getattr(cfg, k) for k in ("eps_low", "eps_high") if k in rule_params(cfg.weighting)}
    return Weighting(get_weighting(cfg.weighting), {**shared, **cfg.weighting_params})


def loss_settings_of(cfg: TrainConfig, max_len: int) -> LossSettings:
    """The GRPO loss of every pass; `max_len` is Dr. GRPO's constant (the longest completion)."""
    return LossSettings(
        eps_low=cfg.eps_low,
        eps_high=cfg.eps_high,
        beta=cfg.beta,
        aggregation=cfg.aggregation,
        clip_ratio_c=cfg.clip_ratio_c,
        max_len=max_len,
    )


def schedule_of(cfg: TrainConfig) -> Schedule:
    """How a step's rows become optimizer updates."""
    return Schedule(
        num_iterations=cfg.num_iterations,
        mini_batches=cfg.mini_batches,
        grad_accum=cfg.grad_accum,
        grad_clip=cfg.grad_clip,
    )


def update_of(
    cfg: TrainConfig,
    policy: Policy,
    *,
    weighting: Weighting,
    correction: RolloutCorrection | None,
    max_len: int,
) -> GRPOUpdate:
    """The optimizer updates of every step, for `policy` under the config's loss and schedule."""
    return GRPOUpdate(
        policy,
        weighting,
        loss_settings_of(cfg, max_len),
        schedule_of(cfg),
        correction=correction,
        # log pi_old from the loss pass itself, without a scoring forward, where that is exact
        reuse_old_logprobs=cfg.reuse_old_logprobs,
        attribute_entropy=cfg.attribute_entropy,
    )


def recorder_of(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    model,
    tokenizer,
    weighting: Weighting,
    temperature: float,
    start_step: int,
    doctor: Doctor | None,
    loss: LossSettings,
) -> Recorder:
    """The run's Recorder, with the config's buckets, attribution, budget, what-if rules (evaluated with
    the run's own `loss` and clip), doctor options and resume step."""
    return Recorder(
        cfg.run_dir if in_bucket(cfg.run_dir) else run_dir,  # a run in a bucket: its URL
        model=model,
        tokenizer=tokenizer,
        config=cfg.to_dict(),
        info=RunInfo(
            name=cfg.run_name or run_dir.name,
            model_name=cfg.model,
            weighting=rule_meta(cfg.weighting, weighting.params),
            temperature=temperature,
        ),
        buckets=cfg.bucket_every,
        attribution=Attribution(
            every=cfg.attribute_every,
            method=cfg.attribute_method,
            entropy=cfg.attribute_entropy,
            on_spike=cfg.attribute_on_spike,
        ),
        budget=cfg.token_budget or None,
        whatif=whatif_of(cfg, loss),
        resume_step=start_step if cfg.resume else None,  # no checkpoint yet: from step 0
        doctor=doctor,
    )


def whatif_of(cfg: TrainConfig, loss: LossSettings) -> WhatIf:
    """The config's what-if rules (`whatif`, every `whatif_every` steps), with the run's loss and clip."""
    return WhatIf(
        rules=cfg.whatif,
        every=cfg.whatif_every if cfg.whatif else 0,
        loss=asdict(loss),
        max_grad_norm=cfg.grad_clip or None,
    )
