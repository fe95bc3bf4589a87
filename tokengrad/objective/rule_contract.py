"""The contract of a token-weighting rule: what it sees (`TokenBatch`), what it returns (`TokenWeights`)
and what it declares about itself (`WeightingRule`, the registry's entry). The rules themselves and their
registry are in `tokengrad.objective.weighting`.

    @register_weighting("lopti", pointwise=True, returns=("phases",))
    def lopti(batch, eta=0.5, low_first=True): ...

    rule = get_weighting("lopti")        # a WeightingRule, called like the function it wraps
    rule.has_phases({})                  # True: the trainer plans two updates per step
    rule(batch, eta=0.4)                 # TokenWeights; a field the rule did not declare is a ValueError

Everything the trainer and the integrations need to know about a rule before running it is declared at
registration and read from here: whether its weight is a function of p alone (`pointwise`), whether the
loss keeps the PPO clip (`ppo_clip`), which `TokenWeights` fields it returns (`returns`: plain gradient
scales, a weight inside min/clip, a penalty, extra update phases), and the warnings of a parameter setting
(`check`). No rule is run on a probe batch to find out; a rule that returns a field it did not declare is
stopped at the call, so a declaration cannot drift from what the rule does.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# The fields a rule returns unless it declares others: per-token scales of the gradient (of the token's
# loss term, or of its advantage), which every consumer can apply, TRL's and verl's losses included.
GRADIENT_SCALES = ("loss_weight", "advantage_weight")
Returns = tuple[str, ...] | Callable[[dict], tuple[str, ...]]


def check_token_tensors(**named: Tensor | None) -> None:
    """Raise ValueError unless every given tensor (None is skipped) has the same 2-D shape [N, T]."""
    shapes = {k: tuple(v.shape) for k, v in named.items() if v is not None}
    if not shapes:
        return
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        listing = ", ".join(f"{k}={list(s)}" for k, s in shapes.items())
        raise ValueError(f"expected tensors of one shape [N, T]; got {listing}")


def check_finite(mask: Tensor, **named: Tensor | None) -> None:
    """Raise ValueError if a tensor is NaN/inf at a position where ``mask`` is set."""
    valid = mask > 0  # [N, T]
    for name, x in named.items():
        if x is not None and not bool(torch.isfinite(x[valid]).all()):
            raise ValueError(f"{name} has NaN or inf at tokens inside the mask")


def broadcast_tokens(x: Tensor, like: Tensor, name: str) -> Tensor:
    """[N] (one value per sequence) or [N, T] -> [N, T]; anything else is a ValueError."""
    if x.dim() == 1 and like.dim() == 2 and x.shape[0] == like.shape[0]:
        return x[:, None].expand_as(like)  # [N, T]
    check_token_tensors(**{name: x, "logprobs": like})
    return x


@dataclass(frozen=True, kw_only=True)
class TokenBatch:
    """What every rule sees. Tensors are detached and promoted to at least float32 on construction;
    ``advantages`` may be given per sequence [N] and is broadcast to [N, T]."""

    logprobs: Tensor  # [N, T] current log pi_theta (at the time of the loss pass)
    old_logprobs: Tensor  # [N, T] log pi_old (rollout policy)
    advantages: Tensor  # [N, T] advantage broadcast to tokens
    mask: Tensor  # [N, T] float, 1 = token in the loss

    def __post_init__(self) -> None:
        dtype = torch.promote_types(self.logprobs.dtype, torch.float32)
        lp = self.logprobs.detach().to(dtype)  # [N, T]
        adv = broadcast_tokens(self.advantages.detach().to(dtype), lp, "advantages")  # [N, T]
        fields = dict(
            logprobs=lp,
            old_logprobs=self.old_logprobs.detach().to(dtype),
            advantages=adv,
            mask=self.mask.detach().to(dtype),
        )
        check_token_tensors(**fields)
        check_finite(fields["mask"], logprobs=lp, old_logprobs=fields["old_logprobs"], advantages=adv)
        for name, value in fields.items():
            object.__setattr__(self, name, value)  # frozen dataclass: normalise once, here


@dataclass(frozen=True)
class TokenWeights:
    """What a rule returns; every field defaults to "no effect"."""

    loss_weight: Tensor | None = None  # [N, T] multiplies the per-token policy-gradient loss
    ratio_weight: Tensor | None = None  # [N, T] multiplies the ratio inside min/clip
    advantage_weight: Tensor | None = None  # [N, T] multiplies the advantage
    kl_cov_coef: Tensor | None = None  # [N, T] coefficient of the KL-Cov penalty |log r| (0 elsewhere)
    phases: tuple[Tensor, ...] | None = None  # ordered [N, T] masks, one update each

    def effective(self, like: Tensor | None = None) -> Tensor:
        """[N, T] product of the multiplicative weights (the recorded ``weight`` column).

        When no multiplicative weight is set the result is ``ones_like(like)``, or a scalar 1 if
        ``like`` is not given (broadcasts against any [N, T])."""
        parts = [w for w in (self.loss_weight, self.ratio_weight, self.advantage_weight) if w is not None]
        if not parts:
            return torch.ones_like(like) if like is not None else torch.tensor(1.0)
        out = parts[0]
        for w in parts[1:]:
            out = out * w  # [N, T]
        return out


FIELDS = tuple(f.name for f in dataclasses.fields(TokenWeights))


class WeightingRule:
    """A rule function with its declared capabilities; calling it calls the function.

    Args:
        name: the registry name.
        fn: `fn(batch: TokenBatch, **params) -> TokenWeights`; keyword defaults are the rule's defaults.
        pointwise: the effective weight is a function of the token probability alone, so it is drawn as
            w(p) and evaluated on each micro-batch's live log-probs (no batch statistics).
        ppo_clip: False drops the PPO clip from the loss (a rule whose source has none, KL-Cov).
        returns: the `TokenWeights` fields the rule may set, or a function of its parameters (defaults
            filled in) giving them, for a rule whose output depends on a parameter (TR-GRPO's placement).
        check: `check(params, eps_low=, eps_high=) -> list[str]`: warnings about a parameter setting in
            combination with the loss's clip range.
    """

    def __init__(
        self,
        name: str,
        fn: Callable,
        *,
        pointwise: bool = False,
        ppo_clip: bool = True,
        returns: Returns = GRADIENT_SCALES,
        check: Callable | None = None,
    ):
        if not callable(returns):
            unknown = sorted(set(returns) - set(FIELDS))
            if unknown:
                raise ValueError(f"rule {name!r}: returns={returns!r} names no TokenWeights field {unknown}")
            returns = tuple(returns)
        self.name, self.fn, self.returns, self.check = name, fn, returns, check
        self.pointwise, self.ppo_clip = bool(pointwise), bool(ppo_clip)
        functools.update_wrapper(self, fn)  # name, docstring and signature (inspect follows __wrapped__)
        sig = list(inspect.signature(fn).parameters.items())[1:]
        self.defaults = {k: p.default for k, p in sig}  # the rule's keyword parameters

    def __call__(self, batch, **params):
        weights = self.fn(batch, **params)
        set_fields = [f.name for f in dataclasses.fields(weights) if getattr(weights, f.name) is not None]
        undeclared = sorted(set(set_fields) - set(self.fields(params)))
        if undeclared:
            raise ValueError(
                f"weighting rule {self.name!r} returned {undeclared}, which its registration does not "
                f"declare; register it with returns={tuple(sorted(set(set_fields)))!r}"
            )
        return weights

    def fields(self, params: dict | None = None) -> tuple[str, ...]:
        """The `TokenWeights` fields the rule returns with these parameters (defaults filled in)."""
        if callable(self.returns):
            return tuple(self.returns({**self.defaults, **(params or {})}))
        return self.returns

    def has_phases(self, params: dict | None = None) -> bool:
        """Whether the rule splits a step into update phases (Lopti), fixed from pi_old up front."""
        return "phases" in self.fields(params)

    def __repr__(self) -> str:
        return f"WeightingRule({self.name!r})"
