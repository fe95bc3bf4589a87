"""Weighting rules as a per-token scale of dL/dlog pi in backward: the form in which a rule acts on a host
trainer's unmodified loss (TRL, verl). Which rules can act that way, their validated parameters, their
run-format metadata, and one micro-batch's weights.

Through an autograd hook on the host's log-probs the update becomes sum_t w_t c_t grad log pi_t: the gradient
of the host's loss with each token's whole term multiplied by the detached w_t. Rules whose weight acts
inside min/clip (TR-GRPO's ratio placement), add a penalty (KL-Cov) or need extra update phases (Lopti)
cannot be expressed that way and are refused with the list of rules that can.
"""

from __future__ import annotations

import torch

from tokengrad.objective.weighting import (
    WEIGHTINGS,
    TokenBatch,
    get_weighting,
    rule_params,
    validate_params,
    weight_curve,
)

NOT_A_GRADIENT_SCALE = {
    "ratio_weight": "a weight inside min/clip",
    "kl_cov_coef": "an added penalty term",
    "phases": "extra update phases",
}


def unsupported_fields(name: str, params: dict | None = None) -> list[str]:
    """Fields of the rule's TokenWeights that a gradient scale of dL/dlog pi cannot express, as the rule
    declares them (`register_weighting(..., returns=...)`) for these parameters."""
    validate_params(name, params or {})
    returns = get_weighting(name).fields(params)
    return [f for f in NOT_A_GRADIENT_SCALE if f in returns]


def supported_weightings() -> list[str]:
    """Registered rules that can act as a gradient scale (inside TRL or verl), with default parameters."""
    return [n for n in sorted(WEIGHTINGS) if not unsupported_fields(n)]


def resolve_weighting(name: str | None, params: dict | None):
    """(rule, params) for a rule expressible as a gradient scale, else a ValueError listing those that are."""
    if name is None:
        return None
    rule, params = get_weighting(name), dict(params or {})
    bad = unsupported_fields(name, params)  # validates the parameters first
    if bad:
        why = ", ".join(f"{f} ({NOT_A_GRADIENT_SCALE[f]})" for f in bad)
        raise ValueError(
            f"weighting {name!r} with {params} uses {why}, which cannot act as a per-token scale of "
            f"dL/dlog pi on a host trainer's unmodified loss; rules that can: {supported_weightings()}"
        )
    return rule, params


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
    # resolve_weighting refused rules that declare more than a scale; the rule's call refuses the undeclared
    batch = TokenBatch(
        logprobs=logps.detach(), old_logprobs=old.detach(), advantages=adv, mask=loss_mask.float()
    )
    tw = fn(batch, **params)
    if all(w is None for w in (tw.loss_weight, tw.advantage_weight)):
        return None
    return tw.effective().to(logps.device)  # [B, T]
