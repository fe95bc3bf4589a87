"""Weighting rules inside TRL: which rules can act as a per-token scale of dL/dlog pi, their parameters
taken from the trainer, and the weights of one micro-batch.

A rule acts through the autograd hook on TRL's log-probs: the update becomes sum_t w_t c_t grad log pi_t.
That is the gradient of TRL's loss with each token's whole term multiplied by the detached w_t, the
policy term and, when beta > 0, the KL term beta * KL_t as well (attach warns). Rules whose weight acts
inside min/clip, adds a penalty or needs extra update phases cannot be expressed that way and are refused.
"""

from __future__ import annotations

import warnings

import torch

from tokengrad.train.weighting import (
    WEIGHTINGS,
    TokenBatch,
    get_weighting,
    rule_params,
    validate_params,
    weight_curve,
)

NOT_A_GRADIENT_SCALE = {"ratio_weight": "a weight inside min/clip", "kl_cov_coef": "an added penalty term",
                        "phases": "extra update phases"}
# rule parameter -> the trainer attribute it must equal (Clip-Cov's "already clipped" test, arXiv 2505.22617)
TRAINER_PARAMS = {"eps_low": "epsilon_low", "eps_high": "epsilon_high"}


def _probe_batch():
    lp = torch.tensor([[0.05, 0.3, 0.6, 0.95], [0.2, 0.5, 0.7, 0.9]]).log()  # [2, 4]
    return TokenBatch(lp, lp - 0.1, torch.tensor([1.0, -1.0]), torch.ones(2, 4))


def unsupported_fields(name: str, params: dict | None = None) -> list[str]:
    """Fields of the rule's TokenWeights that a gradient scale of dL/dlog pi cannot express."""
    weights = get_weighting(name)(_probe_batch(), **(params or {}))
    return [f for f in NOT_A_GRADIENT_SCALE if getattr(weights, f) is not None]


def supported_weightings() -> list[str]:
    """Registered rules that act inside TRL, with their default parameters."""
    return [n for n in sorted(WEIGHTINGS) if not unsupported_fields(n)]


def resolve_weighting(name: str | None, params: dict | None):
    """(rule, params) for a rule expressible as a gradient scale, else a ValueError listing those that are."""
    if name is None:
        return None
    rule, params = get_weighting(name), dict(params or {})
    validate_params(name, params)
    bad = unsupported_fields(name, params)
    if bad:
        why = ", ".join(f"{f} ({NOT_A_GRADIENT_SCALE[f]})" for f in bad)
        raise ValueError(
            f"weighting {name!r} with {params} uses {why}, which cannot act as a per-token scale of "
            f"dL/dlog pi on TRL's unmodified loss; rules that can: {supported_weightings()}"
        )
    return rule, params


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


def weighting_meta(name: str | None, params: dict | None) -> dict | None:
    if name is None:
        return None
    full = {**rule_params(name), **(params or {})}
    return {"name": name, "params": full, "curve": weight_curve(name, params), "applied_as": "grad_scale"}


def token_weights(rule, logps, old, adv, loss_mask) -> torch.Tensor | None:
    """[B, T] weights of one micro-batch from the detached log-probs, or None when the rule left all at 1."""
    if rule is None:
        return None
    fn, params = rule
    tw = fn(TokenBatch(logps.detach(), old.detach(), adv, loss_mask.float()), **params)
    bad = [f for f in NOT_A_GRADIENT_SCALE if getattr(tw, f) is not None]
    if bad:  # attach() probed the rule; a rule whose output depends on the batch can still get here
        raise ValueError(
            f"the weighting rule returned {bad} for this batch; only a per-token scale can act in TRL"
        )
    if all(w is None for w in (tw.loss_weight, tw.advantage_weight)):
        return None
    return tw.effective().to(logps.device)  # [B, T]
