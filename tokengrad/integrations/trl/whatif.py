"""What-if updates inside TRL: `attach(trainer, run_dir, whatif=...)` evaluates other weighting rules on
each analysed step's micro-batches with TRL's own loss settings (buckets/whatif.py computes the gradients).

The counterfactual loss is tokengrad.objective.loss.policy_loss, so it stands for TRL's loss where the two
are the same function: the PPO-clipped loss types with a per-token importance ratio, TRL's clip epsilons,
its KL coefficient beta (k3 to the reference, as TRL) and its aggregation (grpo: the mean of sequence means;
dapo and bnpo: the token mean; dr_grpo: the token sum over B * max_completion_length). Other settings are
refused at attach in one line naming the setting.
"""

from __future__ import annotations

from tokengrad.record.buckets.whatif import WhatIf

# TRL loss_type -> the aggregation of tokengrad.objective.loss that computes the same normalisation
AGGREGATION_OF = {"grpo": "grpo", "dapo": "dapo", "bnpo": "dapo", "dr_grpo": "dr_grpo"}
DEFAULT_EVERY = 10  # a rule name or list alone: what-if updates every 10 steps


def trl_whatif(value, trainer) -> WhatIf:
    """attach's `whatif` (a WhatIf, a rule spec or a list of them, or None) with TRL's loss and clip."""
    if value is None:
        return WhatIf()
    if not isinstance(value, WhatIf):
        value = WhatIf(rules=value, every=DEFAULT_EVERY)
    if not value.every:
        return value
    refuse_unlike_loss(trainer)
    loss = dict(
        eps_low=float(trainer.epsilon_low),
        eps_high=float(trainer.epsilon_high),
        beta=float(getattr(trainer, "beta", 0.0) or 0.0),
        aggregation=AGGREGATION_OF[trainer.loss_type],
        max_len=int(trainer.args.max_completion_length),
    )
    clip = getattr(trainer.args, "max_grad_norm", None)
    return value.with_host(loss=loss, max_grad_norm=float(clip) if clip else None)


def refuse_unlike_loss(trainer) -> None:
    """A ValueError naming the TRL setting whose loss the counterfactual cannot reproduce."""
    if trainer.loss_type not in AGGREGATION_OF:
        raise ValueError(
            f"attach(whatif=...) evaluates rules with the PPO-clip GRPO loss; TRL loss_type "
            f"{trainer.loss_type!r} is another loss (what-if updates need one of {sorted(AGGREGATION_OF)})"
        )
    if getattr(trainer, "importance_sampling_level", "token") != "token":
        raise ValueError(
            "attach(whatif=...) needs importance_sampling_level='token'; the sequence-level ratio (GSPO) "
            "is not the per-token loss the rules are evaluated with"
        )
    if getattr(trainer.args, "delta", None) is not None:
        raise ValueError(
            f"attach(whatif=...): TRL's two-sided ratio cap delta={trainer.args.delta} is not part of the "
            "loss the rules are evaluated with; set delta=None to record what-if updates"
        )
