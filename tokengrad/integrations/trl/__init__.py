"""Record an unmodified TRL `GRPOTrainer` run into the tokengrad run format.

    from trl import GRPOConfig, GRPOTrainer
    from tokengrad.integrations.trl import attach

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), ...)
    attach(trainer, "runs/trl_demo")                    # or attach(trainer, "runs/x", weighting="tr_grpo")
    trainer.train()

Nothing of TRL's loss is re-implemented (copies drift: TRL PR #6856). Per token, logprob is the tensor
`_get_per_token_logps_and_entropies` returns inside `compute_loss`, and coef = dL/dlog pi is read by an
autograd hook on it, exact for every `loss_type`, clip, KL, mask and aggregation; entropy and sum_j p_j^2
come from TRL's fused LM head (temperature-scaled, like the log-probs); old/ref log-probs, advantages and
masks from the inputs of `compute_loss`; `clipped` is TRL's own clip test on them (loss.py). Grad
norms are read when the trainer calls `accelerator.clip_grad_norm_` (before clipping); rewards and
completions where TRL scores them; the step's loss, lr, rewards, kl and clip share from these hooks and the
trainer's state on every step, whatever `logging_steps` / `logging_strategy` say (step_values.py); TRL's
logged metrics join as `trl_*` on the step TRL logs at, naming the updates they cover (logs.py). One
tokengrad step is one TRL generation batch, holding `steps_per_generation * num_iterations /
gradient_accumulation_steps` optimizer updates (`update_id`); an update that accumulates over several
generation batches is recorded (norms, buckets) in the step where the optimizer steps, its bucket
gradients summed over all of its micro-batches.

A weighting rule acts as a scale of dL/dlog pi_t in backward: the update becomes sum_t w_t c_t grad log pi_t,
the gradient of TRL's loss with each token's term (policy term, plus beta * KL when beta > 0, about which
attach warns) multiplied by the detached w_t before TRL's aggregation (exact for
importance_sampling_level="token"; the entropy bonus is not scaled). Parameters that must match the loss
(Clip-Cov's clip epsilons) are taken from the trainer. Rules that need a weight inside the clip, an added
penalty or extra update phases are refused (weighting.py). docs/api.md has the details.

Modules: this one (attach and its checks), recording (the hooks), fused (the fused LM head's
statistics), loss (TRL's clip definitions), step_values (the step's own scalars), logs (TRL's logs
joined), weighting (a rule's parameters from the trainer; the rule as a gradient scale is
tokengrad.objective.gradient_scale), whatif (other rules' updates with TRL's loss settings).
"""

from __future__ import annotations

from tokengrad.integrations.trl.checks import check_not_training, check_run_dir
from tokengrad.integrations.trl.deepspeed import check_deepspeed, deepspeed_setup
from tokengrad.integrations.trl.logs import column
from tokengrad.integrations.trl.loss import check_loss_type
from tokengrad.integrations.trl.recording import SAMPLE_KEY, TRLRecording, announce
from tokengrad.integrations.trl.unsloth import check_not_unsloth
from tokengrad.integrations.trl.weighting import trainer_params, warn_if_kl_scaled
from tokengrad.integrations.trl.whatif import trl_whatif
from tokengrad.objective.gradient_scale import (
    NOT_A_GRADIENT_SCALE,
    resolve_weighting,
    supported_weightings,
    unsupported_fields,
    weighting_meta,
)
from tokengrad.record.options import Attribution, Buckets, RunInfo, as_buckets, refuse_flat_keywords
from tokengrad.record.recorder import Recorder

__all__ = [
    "attach",
    "check_trl_version",
    "check_trainer",
    "resolve_weighting",
    "supported_weightings",
    "unsupported_fields",
    "TRLRecording",
    "SAMPLE_KEY",
    "NOT_A_GRADIENT_SCALE",
    "TESTED_TRL",
]

TESTED_TRL = ("1.13", "1.17")  # [lowest, first untested) minor versions; keep in step with the `trl` extra
_HOOKED = (
    "compute_loss",
    "_get_per_token_logps_and_entropies",
    "_generate_and_score_completions",
    "_calculate_rewards",
)


def attach(
    trainer,
    run_dir,
    *,
    weighting: str | None = None,
    weighting_params: dict | None = None,
    run_name: str | None = None,
    buckets: Buckets | int = 0,
    attribution: Attribution | int = 0,
    whatif=None,
    allow_untested_trl: bool = False,
    bucket_activations: bool = False,
    **recorder_kwargs,
) -> "TRLRecording":
    """Record `trainer` (a `trl.GRPOTrainer`, before `train()`) into `run_dir`; returns the recording.

    Args:
        weighting, weighting_params: a rule of `tokengrad.objective.weighting` applied as a per-token gradient
            scale (see the module docs for what that equals); None records plain TRL.
        buckets: probability-bucket gradient analysis every N steps, or a `tokengrad.record.Buckets`
            (0 = off; one extra backward per bucket on those steps).
        attribution: each token's exact share of the update every N steps, or a
            `tokengrad.record.Attribution` (default method here: the central difference, since TRL's fused
            LM head has no forward-mode derivative).
        whatif: a `tokengrad.record.WhatIf`, or a rule spec or list of them (then every 10 steps): the
            gradient each rule would have produced from the same parameters on the same micro-batches,
            evaluated with TRL's clip, beta, aggregation and max_grad_norm (whatif.py; PPO-clip loss types).
        allow_untested_trl: try a TRL version outside `TESTED_TRL` instead of refusing it.
        bucket_activations: on bucket steps, run the loss's forward with gradient checkpointing off, so that
            the backward and each bucket pass recompute no layer (about one forward saved per pass); costs
            the activations' memory on those steps. Off by default: the trainer's memory setting holds.
        recorder_kwargs: passed to `tokengrad.Recorder` (budget, output, doctor, layers, resume_step); with
            `doctor=Doctor(halt=True)` a critical finding stops training (`control.should_training_stop`).
    """
    import trl

    buckets, attribution = _options(buckets, attribution, recorder_kwargs)
    check_trl_version(trl.__version__, allow_untested_trl)
    check_trainer(trainer)
    check_run_dir(run_dir, recorder_kwargs.get("resume_step"))
    check_deepspeed(deepspeed_setup(trainer), buckets.every)  # docs/deepspeed.md
    weighting_params = trainer_params(weighting, weighting_params, trainer)
    rule = resolve_weighting(weighting, weighting_params)
    warn_if_kl_scaled(weighting, trainer)
    tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
    pending = getattr(trainer, "_tokengrad_continuation", None)
    if pending is not None:  # an earlier recording waiting for another train(): this one replaces it
        pending.stop_continuing()
    rec = Recorder(
        run_dir,
        model=trainer.model,
        tokenizer=tokenizer,
        config=_run_config(trainer, trl.__version__),
        info=_run_info(trainer, run_name, weighting, weighting_params),
        buckets=buckets,
        attribution=attribution,
        whatif=trl_whatif(whatif, trainer),
        **recorder_kwargs,
    )
    rec.raise_on_halt = False  # doctor=Doctor(halt=True): the callback sets control.should_training_stop
    recording = TRLRecording(trainer, rec, rule)
    recording.bucket_activations = bool(bucket_activations)
    recording.install()
    announce(rec, "attached to the trainer")
    return recording


def _options(buckets, attribution, recorder_kwargs: dict) -> tuple[Buckets, Attribution]:
    """attach's Buckets and Attribution from numbers or option objects (an earlier release's flat keyword
    in `recorder_kwargs` is refused with its grouped form); refuses what TRL cannot record."""
    refuse_flat_keywords(recorder_kwargs, caller="attach")
    buckets = as_buckets(buckets)
    if not isinstance(attribution, Attribution):
        # TRL's fused LM head is a custom autograd.Function without a forward-mode derivative, so update
        # shares inside TRL come from the central difference (two plain forwards) unless asked otherwise
        attribution = Attribution(every=attribution or 0, method="central_difference")
    if attribution.entropy:  # the recompute this integration hands the recorder scores log-probs only
        raise ValueError(
            "attach(attribution=Attribution(entropy=True)) is not supported: entropy attribution needs "
            "recompute() to return differentiable (log-probs, entropy), and the TRL integration's returns "
            "the log-probs only; use the built-in trainer (attribute_entropy = true) or your own loop"
        )
    return buckets, attribution


def _run_info(trainer, run_name, weighting, weighting_params) -> RunInfo:
    """The run's name, model, weighting rule and TRL's sampling temperature, for meta.json."""
    model_cfg = getattr(trainer.model, "config", None)
    return RunInfo(
        name=run_name,
        model_name=getattr(model_cfg, "_name_or_path", None) or None,
        weighting=weighting_meta(weighting, weighting_params),
        # TRL divides the logits by its sampling temperature before every log-prob (as the recorder's values)
        temperature=float(getattr(trainer, "temperature", 1.0) or 1.0),
    )


def check_trl_version(version: str, allow_untested: bool = False) -> None:
    """Refuse TRL releases outside TESTED_TRL: the hooks reach into GRPOTrainer's private methods."""
    from packaging.version import Version

    lo, hi = (Version(v).release[:2] for v in TESTED_TRL)
    if lo <= Version(version).release[:2] < hi or allow_untested:
        return
    raise RuntimeError(
        f"tokengrad's TRL integration is tested with trl>={TESTED_TRL[0]},<{TESTED_TRL[1]} "
        f"but trl {version} is "
        f"installed. It hooks GRPOTrainer internals ({', '.join(_HOOKED)}) whose signatures and data change "
        f"between releases, so another version may record wrong numbers. Install `tokengrad[trl]`, or pass "
        f"allow_untested_trl=True to try anyway."
    )


def check_trainer(trainer) -> None:
    """A clear error for trainers whose per-token log-probs cannot be hooked."""
    from trl import GRPOTrainer

    check_not_unsloth(trainer)  # first: Unsloth rebinds trl.GRPOTrainer, so isinstance passes
    if not isinstance(trainer, GRPOTrainer):
        raise ValueError(f"attach() records a trl.GRPOTrainer, got {type(trainer).__name__}")
    missing = [name for name in _HOOKED if not callable(getattr(trainer, name, None))]
    if missing:
        raise RuntimeError(f"this GRPOTrainer has no {missing}; the TRL integration cannot attach to it")
    if getattr(trainer.args, "use_liger_kernel", False) and hasattr(trainer, "compute_liger_loss"):
        raise ValueError(
            "use_liger_kernel=True: this TRL computes the GRPO loss inside Liger's fused kernel "
            "(compute_liger_loss), which bypasses _compute_loss and never exposes per-token log-probs, so "
            "coef, entropy and the weighting hook have nothing to attach to. Set use_liger_kernel=False."
        )
    if getattr(trainer, "_tokengrad_recording", None) is not None:
        raise ValueError("a tokengrad recording is already attached to this trainer")
    check_not_training(trainer)
    check_loss_type(trainer.loss_type)


def _run_config(trainer, trl_version: str) -> dict:
    args = trainer.args.to_dict() if hasattr(trainer.args, "to_dict") else dict(vars(trainer.args))
    ds = deepspeed_setup(trainer)
    extra = {} if ds is None else {"deepspeed": {"zero_stage": ds.zero_stage, "config": ds.config}}
    return {
        "integration": "trl",
        "trl_version": trl_version,
        "trainer": type(trainer).__name__,
        "args": args,
        # the samples columns of the reward functions (recording.py names them so)
        "reward_columns": [f"reward_{column(name)}" for name in trainer.reward_func_names],
        **extra,
    }
