"""Token-weighting rules: which tokens of a GRPO batch count, and how much.

Every rule is a pure function ``rule(batch: TokenBatch, **params) -> TokenWeights`` registered by name
in ``WEIGHTINGS``. A rule never sees the model or the trainer, only the batch's detached per-token
tensors; ``tokengrad.objective.loss.policy_loss`` applies what it returns.

    from tokengrad.objective.weighting import TokenBatch, get_weighting
    batch = TokenBatch(logprobs, old_logprobs, advantages, mask)       # [N, T] each
    weights = get_weighting("tr_grpo")(batch, alpha=2.0)                # TokenWeights

How to add a rule: write one function in this file (or in your own module, imported before use),
decorate it, cite the paper in its docstring, and return a ``TokenWeights`` whose unused fields stay
``None``::

    @register_weighting("my_rule", pointwise=True)   # pointwise: weight is a function of p alone
    def my_rule(batch: TokenBatch, gamma: float = 1.0) -> TokenWeights:
        \"\"\"One-line idea. Introduced by arXiv:XXXX.XXXXX.\"\"\"
        p = batch.logprobs.exp()                      # [N, T]
        return TokenWeights(loss_weight=p**gamma)     # [N, T]

Its parameters and their defaults are read from the signature (``rule_params``), so keyword
defaults are the documented defaults. A rule that sets more than the gradient scales ``loss_weight`` and
``advantage_weight`` says so at registration (``returns=("ratio_weight",)``, ``("phases",)``, ...): the
trainer plans its updates and the TRL/verl integrations accept or refuse it from that declaration
(``tokengrad.objective.rule_contract``), and a rule returning a field it did not declare is an error.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from tokengrad.objective.params import check_params
from tokengrad.objective.rule_contract import (
    GRADIENT_SCALES,
    Returns,
    TokenBatch,
    TokenWeights,
    WeightingRule,
)
from tokengrad.registry import Registry

WEIGHTINGS: Registry[WeightingRule] = Registry("weighting rule")


def register_weighting(
    name: str,
    *,
    pointwise: bool = False,
    ppo_clip: bool = True,
    returns: Returns = GRADIENT_SCALES,
    check: Callable | None = None,
) -> Callable:
    """Decorator: ``WEIGHTINGS[name] = WeightingRule(name, fn, ...)`` (a taken name is refused); returns
    ``fn`` unchanged. What the rule declares is the one description of it the trainer and the
    integrations read (``tokengrad.objective.weighting_rule``):

    ``pointwise``: the effective weight is a function of the token probability alone, so ``weight_curve``
    can draw it (rules that are not pointwise take batch statistics, computed once per optimizer update).
    ``ppo_clip=False`` drops the PPO clip from the loss for a rule whose source has none. ``returns``: the
    ``TokenWeights`` fields it sets (default: the gradient scales ``loss_weight``, ``advantage_weight``),
    or a function of its parameters giving them; ``"phases"`` there makes the trainer plan one update
    per phase. ``check(params, eps_low=, eps_high=) -> list[str]`` returns warnings about a parameter
    setting in combination with the loss's clip range (``check_rule``)."""

    def deco(fn: Callable) -> Callable:
        rule = WeightingRule(name, fn, pointwise=pointwise, ppo_clip=ppo_clip, returns=returns, check=check)
        WEIGHTINGS.add(name, rule)
        return fn

    return deco


def check_rule(name: str, params: dict, *, eps_low: float, eps_high: float) -> list[str]:
    """The warnings of rule ``name``'s ``check`` for these parameters (its defaults filled in)."""
    rule = get_weighting(name)
    if rule.check is None:
        return []
    return list(rule.check({**rule.defaults, **params}, eps_low=eps_low, eps_high=eps_high))


def get_weighting(name: str) -> WeightingRule:
    """The rule registered as ``name`` (called like its function); unknown names raise ValueError listing
    the known ones."""
    return WEIGHTINGS[name]


def rule_params(name: str) -> dict:
    """Defaults of a rule's keyword parameters, read from its signature (for meta.json/config)."""
    return dict(get_weighting(name).defaults)


def validate_params(name: str, params: dict) -> None:
    """Raise ValueError if ``params`` does not fit the rule's signature (``check_params``)."""
    check_params(name, params, rule_params(name))


def rule_meta(name: str, params: dict) -> dict:
    """meta.json's description of a rule: name, scalar parameters (defaults filled in) and w(p) curve."""
    full = {**rule_params(name), **params}
    full = {k: v for k, v in full.items() if isinstance(v, (int, float, str, bool, type(None)))}
    return {"name": name, "params": full, "curve": weight_curve(name, params)}


def weight_curve(name: str, params: dict | None = None, n: int = 101) -> dict | None:
    """w(p) on ``n`` grid points of p in [0, 1] for pointwise rules, else None.

    The rule is evaluated on a synthetic batch with pi_theta = pi_old = p and advantage 1."""
    rule = get_weighting(name)
    if not rule.pointwise:
        return None
    params = dict(params or {})
    validate_params(name, params)
    p = torch.linspace(0.0, 1.0, n, dtype=torch.float64)  # [n]
    lp = p.clamp_min(1e-30).log()[None, :]  # [1, n]; log 0 would be -inf
    ones = torch.ones_like(lp)
    batch = TokenBatch(logprobs=lp, old_logprobs=lp, advantages=ones, mask=ones)
    w = rule(batch, **params).effective(ones)  # [1, n]
    return {"p": p.tolist(), "w": w[0].tolist()}


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Scalar mean of x over mask > 0 (0 for an empty mask)."""
    return torch.where(mask > 0, x, 0.0).sum() / mask.sum().clamp_min(1.0)


def _token_covariance(batch: TokenBatch) -> Tensor:
    """Per-token covariance term (log pi - mean log pi)(A - mean A), means over the batch's loss
    tokens, as in arXiv 2505.22617 (Clip-Cov/KL-Cov) and arXiv 2605.11538 (CW-GRPO). 0 off-mask."""
    lp, adv, m = batch.logprobs, batch.advantages, batch.mask  # [N, T]
    cov = (lp - _masked_mean(lp, m)) * (adv - _masked_mean(adv, m))  # [N, T]
    return torch.where(m > 0, cov, 0.0)


# ---------------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------------


@register_weighting("grpo", pointwise=True, returns=())
def grpo(batch: TokenBatch) -> TokenWeights:
    """No weighting: plain GRPO (DeepSeekMath, arXiv:2402.03300)."""
    return TokenWeights()


def _tr_shape(p: Tensor, *, alpha: float, k: float, mu: float, lower: float, upper: float) -> Tensor:
    """clip(alpha * (sigmoid(k * p) - mu), lower, upper), elementwise."""
    return (alpha * (torch.sigmoid(k * p) - mu)).clamp(lower, upper)


_TR_PLACEMENTS = {"loss": "loss_weight", "ratio": "ratio_weight"}


def _tr_check(params: dict, *, eps_low: float, eps_high: float) -> list[str]:
    """placement="ratio" with w above 1 + eps_high: on-policy (r = 1) a token with w > 1 + eps_high sits
    beyond the clip, so every A > 0 token there gets no gradient. With the preset (U = 1.4, eps_high 0.2)
    that is w(p) > 1.2, i.e. sigmoid(9 p) > 0.85, p > ln(0.85 / 0.15) / 9 = 0.193."""
    if params.get("placement") != "ratio" or params["upper"] <= 1.0 + eps_high:
        return []
    return [
        f"tr_grpo placement='ratio' with upper={params['upper']} > 1 + eps_high = {1 + eps_high:g}: "
        f"on-policy, every A > 0 token whose weight exceeds {1 + eps_high:g} is clipped and gets no "
        f"gradient (with the preset: p > 0.19); raise eps_high or lower upper, or use placement='loss'"
    ]


def _tr_field(placement: str) -> str:
    """The TokenWeights field TR-GRPO's weight goes into for this placement."""
    if placement not in _TR_PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; known placements: {sorted(_TR_PLACEMENTS)}")
    return _TR_PLACEMENTS[placement]


def _tr_returns(params: dict) -> tuple[str, ...]:
    return (_tr_field(params["placement"]),)  # "ratio": a weight inside min/clip, no gradient scale


def _tr_weights(w: Tensor, placement: str) -> TokenWeights:
    return TokenWeights(**{_tr_field(placement): w})


@register_weighting("tr_grpo", pointwise=True, returns=_tr_returns, check=_tr_check)
def tr_grpo(
    batch: TokenBatch,
    *,
    alpha: float = 2.0,
    k: float = 9.0,
    mu: float = 0.25,
    lower: float = 1.0,
    upper: float = 1.4,
    placement: str = "loss",
) -> TokenWeights:
    """TR-GRPO token regulation (arXiv:2511.00066): up-weight high-probability tokens.

    w = clip(alpha * (sigmoid(k * p) - mu), lower, upper), p = pi_theta(token) of the current policy,
    detached. The paper describes "a monotone probability shaping function" (a sigmoid followed by a
    clip, per the ICLR 2026 reviews, OpenReview rhV6QTMqq1) but its exact formula and defaults are not
    published in a verifiable form and there is no official code. The defaults here (alpha 2, k 9,
    mu 0.25, L 1, U 1.4) are a community re-implementation's preset, i.e. a reading, not the paper's
    values. That preset writes sigmoid(p / tau) with tau = 9, which is constant 1 after the clip
    (sigmoid(p/9) is in [0.5, 0.528], so alpha*(sigma - mu) <= 0.556 < L); we therefore use
    sigmoid(k * p) (tau = 1/k), which rises from w = 1 at p <= ln(3)/9 ~ 0.122 to w = 1.4 at
    p >= ln(19)/9 ~ 0.327.

    placement: "loss" (default) multiplies the per-token policy-gradient loss by w, scaling each
    token's gradient by w; "ratio" puts w on the ratio inside min and clip,
    min(w r A, clip(w r, 1-eps_low, 1+eps_high) A), the reviewers' reading of the paper's Eq. 9
    (with w >= 1 this also clips more tokens: with upper 1.4 and eps_high 0.2 every A > 0 token with
    p > 0.19 is clipped on-policy, w(p) > 1.2; the trainer warns when upper > 1 + eps_high).
    """
    return _tr_weights(
        _tr_shape(batch.logprobs.exp(), alpha=alpha, k=k, mu=mu, lower=lower, upper=upper), placement
    )


@register_weighting("tr_grpo_reverse", pointwise=True, returns=_tr_returns, check=_tr_check)
def tr_grpo_reverse(
    batch: TokenBatch,
    *,
    alpha: float = 2.0,
    k: float = 9.0,
    mu: float = 0.25,
    lower: float = 1.0,
    upper: float = 1.4,
    placement: str = "loss",
) -> TokenWeights:
    """The "Reverse" ablation of TR-GRPO (arXiv:2511.00066): the TR-GRPO shaping function evaluated
    at 1 - p, so low-probability tokens get the larger weights. The paper's definition of Reverse is
    not published in a verifiable form; this mirror image is our reading. Parameters as ``tr_grpo``.
    """
    return _tr_weights(
        _tr_shape(1.0 - batch.logprobs.exp(), alpha=alpha, k=k, mu=mu, lower=lower, upper=upper), placement
    )


def _ar_weight(batch: TokenBatch, alpha: float) -> Tensor:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"ar alpha must be in [0, 1], got {alpha}")
    return alpha * batch.old_logprobs.exp() + (1.0 - alpha)  # [N, T]


def _lopti_phases(batch: TokenBatch, eta: float, low_first: bool) -> tuple[Tensor, ...]:
    low = (batch.old_logprobs.exp() < eta).to(batch.mask.dtype) * batch.mask  # [N, T]
    high = batch.mask - low  # [N, T]
    return (low, high) if low_first else (high, low)


@register_weighting("ar", pointwise=True, returns=("advantage_weight",))
def ar(batch: TokenBatch, alpha: float = 0.3) -> TokenWeights:
    """Advantage Reweighting (AR-Lopti, arXiv:2505.12929): A <- (alpha * p_old + 1 - alpha) * A.

    p_old = pi_old(token), so the weight is constant across the step's updates (as in the authors'
    code); alpha = 0 is GRPO. Weights are not renormalised. The authors' K&K scripts use alpha 0.2
    (AR alone) and 0.3 (AR + Lopti); a secondary note reports alpha 0.1 for math."""
    return TokenWeights(advantage_weight=_ar_weight(batch, alpha))


@register_weighting("lopti", pointwise=True, returns=("phases",))
def lopti(batch: TokenBatch, eta: float = 0.5, low_first: bool = True) -> TokenWeights:
    """Low-Probability Token Isolation (AR-Lopti, arXiv:2505.12929): two updates per step, first on
    tokens with p_old < eta (strict, as the authors' code), then on the rest. The KL term is masked
    per phase along with the policy loss. ``low_first=False`` is the paper's reversed-order
    ablation (reported to train worse than GRPO)."""
    return TokenWeights(phases=_lopti_phases(batch, eta, low_first))


@register_weighting("ar_lopti", pointwise=True, returns=("advantage_weight", "phases"))
def ar_lopti(batch: TokenBatch, alpha: float = 0.3, eta: float = 0.5, low_first: bool = True) -> TokenWeights:
    """AR and Lopti together (arXiv:2505.12929), the paper's best K&K setting (alpha 0.3, eta 0.5)."""
    return TokenWeights(
        advantage_weight=_ar_weight(batch, alpha), phases=_lopti_phases(batch, eta, low_first)
    )


@register_weighting("cw_grpo", returns=("advantage_weight",))
def cw_grpo(batch: TokenBatch) -> TokenWeights:
    """CW-GRPO Gaussian-kernel advantage reweighting (arXiv:2605.11538), hyperparameter-free.

    c = (log p - mean log p)(A - mean A) over the batch's loss tokens; w = exp(-c^2 / (2 sigma^2)) with
    sigma the (population) std of c over those tokens; w is renormalised to mean 1 over the loss
    tokens and multiplies the advantage. Centring over the optimizer update's tokens (the batch passed
    in) and detaching w are our reading (unstated in the sources). If sigma = 0 every token gets
    weight 1."""
    m = batch.mask  # [N, T]
    c = _token_covariance(batch)  # [N, T]
    var = _masked_mean((c - _masked_mean(c, m)) ** 2, m)  # scalar sigma^2
    w = torch.where(var > 0, torch.exp(-(c**2) / (2 * var.clamp_min(1e-30))), 1.0)  # [N, T]
    w = w * m.sum() / torch.where(m > 0, w, 0.0).sum().clamp_min(1e-30)  # mean 1 over loss tokens
    return TokenWeights(advantage_weight=torch.where(m > 0, w, 1.0))


def _generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator | None:
    return generator if generator is not None or seed is None else torch.Generator().manual_seed(seed)


@register_weighting("clip_cov", returns=("loss_weight",))
def clip_cov(
    batch: TokenBatch,
    *,
    fraction: float = 2e-4,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    seed: int | None = None,
    generator: torch.Generator | None = None,
) -> TokenWeights:
    """Clip-Cov (arXiv:2505.22617): zero the gradient of a random subset of high-covariance tokens.

    Candidates are loss tokens with cov_low < Cov < cov_high (Cov as in ``_token_covariance``) that
    the PPO clip has not already removed (eps_low/eps_high must match the loss; the authors' scripts
    use 1.0/1.0 there). max(floor(fraction * n_tokens), 1) of them, or all if fewer, are drawn
    uniformly and get loss weight 0. Defaults r = 2e-4, omega_low = 1, omega_high = 5 are the
    published ones. ``generator`` (or ``seed``) makes the draw reproducible; vary the seed per step."""
    m = batch.mask  # [N, T]
    ratio = (batch.logprobs - batch.old_logprobs).exp()  # [N, T]
    adv = batch.advantages  # [N, T]
    already_clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * adv < ratio * adv  # [N, T]
    cov = _token_covariance(batch)  # [N, T]
    cand = (m > 0) & ~already_clipped & (cov > cov_low) & (cov < cov_high)  # [N, T]
    idx = cand.flatten().nonzero().squeeze(1)  # [C]
    n_pick = min(max(int(fraction * float(m.sum())), 1), idx.numel())
    perm = torch.randperm(idx.numel(), generator=_generator(seed, generator))[:n_pick]
    weight = torch.ones_like(m)  # [N, T]
    weight.view(-1)[idx[perm.to(idx.device)]] = 0.0
    return TokenWeights(loss_weight=weight)


@register_weighting("kl_cov", ppo_clip=False, returns=("kl_cov_coef",))
def kl_cov(batch: TokenBatch, fraction: float = 2e-3, kl_cov_coef: float = 1.0) -> TokenWeights:
    """KL-Cov (arXiv:2505.22617): add kl_cov_coef * |log r| to the loss of the top-k tokens by Cov.

    k = max(floor(fraction * n_tokens), 1). Defaults: kl_cov_coef 1 (the authors' ppo_kl_coef; not named
    beta, which is the reference-KL coefficient everywhere else) and
    fraction 2e-3, the authors' 7B script (k_percent 0.2, i.e. 0.2%); their 32B script uses 2e-4 and
    verl's default is 2e-4 with coefficient 0.1. The paper's KL-Cov loss has no PPO clip (the authors'
    and verl's ``compute_policy_loss_kl_cov`` use -A r), so the rule is registered with ppo_clip=False.
    Covariance and top-k are taken over the optimizer update's tokens."""
    m = batch.mask  # [N, T]
    n_tokens = int(m.sum())
    coef = torch.zeros_like(m)  # [N, T]
    if n_tokens == 0:
        return TokenWeights(kl_cov_coef=coef)
    cov = torch.where(m > 0, _token_covariance(batch), -math.inf)  # [N, T]
    top = cov.flatten().topk(min(max(int(fraction * n_tokens), 1), n_tokens)).indices  # [k]
    coef.view(-1)[top] = kl_cov_coef
    return TokenWeights(kl_cov_coef=coef)
