"""Weighting rules inside TRL: a rule's parameters taken from the trainer (the rule as a per-token scale of
dL/dlog pi, and its weights, are tokengrad.objective.gradient_scale).

A rule acts through the autograd hook on TRL's log-probs: the update becomes sum_t w_t c_t grad log pi_t.
That is the gradient of TRL's loss with each token's whole term multiplied by the detached w_t, the
policy term and, when beta > 0, the KL term beta * KL_t as well (attach warns). Rules whose weight acts
inside min/clip, adds a penalty or needs extra update phases cannot be expressed that way and are refused.
"""

from __future__ import annotations

import warnings

from tokengrad.objective.weighting import rule_params

# rule parameter -> the trainer attribute it must equal (Clip-Cov's "already clipped" test, arXiv 2505.22617)
TRAINER_PARAMS = {"eps_low": "epsilon_low", "eps_high": "epsilon_high"}


def trainer_params(name: str | None, params: dict | None, trainer) -> dict | None:
    """The rule's parameters with the trainer's own values filled in (TRL's clip epsilons for a rule that
    tests the clip); a given value that contradicts the trainer is an error, not a silent mismatch."""
    if name is None:
        return None
    params = dict(params or {})
    for key, attr in TRAINER_PARAMS.items():
        if key not in rule_params(name):
            continue
        value = float(getattr(trainer, attr))
        if key in params and float(params[key]) != value:
            raise ValueError(
                f"weighting {name!r}: {key}={params[key]} but the trainer's loss clips with {attr}={value}; "
                f"the rule's clip test must match the loss, so leave {key} out (it is taken from the trainer)"
            )
        params[key] = value
    return params


def warn_if_kl_scaled(name: str | None, trainer) -> None:
    if name is not None and float(getattr(trainer, "beta", 0.0)) != 0.0:
        warnings.warn(
            f"tokengrad: weighting {name!r} with beta={trainer.beta}: the weight scales each token's whole "
            f"loss term in backward, so the KL penalty beta * KL_t is weighted too, not only the policy term",
            UserWarning,
            stacklevel=3,
        )
