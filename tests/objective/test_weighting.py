"""Every weighting rule's values on small hand-made batches, plus the registry contract."""

import math

import pytest
import torch

import tokengrad.objective.weighting as weighting
from tokengrad.objective.loss import policy_loss
from tokengrad.objective.rule_contract import FIELDS
from tokengrad.objective.weighting import (
    TokenBatch,
    TokenWeights,
    get_weighting,
    register_weighting,
    rule_params,
    validate_params,
    weight_curve,
)

F64 = torch.float64
ALL_RULES = ["ar", "ar_lopti", "clip_cov", "cw_grpo", "grpo", "kl_cov", "lopti", "tr_grpo", "tr_grpo_reverse"]


def _t(rows):
    return torch.tensor(rows, dtype=F64)


def _prob_batch(p, p_old=None):
    """A [1, n] batch with the given current (and old) token probabilities, advantage 1."""
    lp = _t([p]).log()
    old = _t([p_old]).log() if p_old is not None else lp
    return TokenBatch(
        logprobs=lp, old_logprobs=old, advantages=torch.ones(1, dtype=F64), mask=torch.ones_like(lp)
    )


def test_registry_lists_rules_and_unknown_name_error():
    assert sorted(weighting.WEIGHTINGS) == ALL_RULES
    with pytest.raises(
        ValueError, match=r"unknown weighting rule 'tr-grpo'; known weighting rules: \['ar', 'ar_lopti', "
    ):
        get_weighting("tr-grpo")
    assert rule_params("tr_grpo") == dict(alpha=2.0, k=9.0, mu=0.25, lower=1.0, upper=1.4, placement="loss")
    assert rule_params("ar") == {"alpha": 0.3} and rule_params("grpo") == {}
    with pytest.raises(ValueError, match=r"has no parameters \['tau'\]"):
        validate_params("tr_grpo", {"tau": 9.0})


@pytest.fixture
def no_square():
    weighting.WEIGHTINGS.get("square") and weighting.WEIGHTINGS.unregister("square")
    yield
    weighting.WEIGHTINGS.get("square") and weighting.WEIGHTINGS.unregister("square")


def test_adding_a_rule_is_one_decorated_function(no_square):
    @register_weighting("square", pointwise=True)
    def square(batch: TokenBatch, gamma: float = 2.0) -> TokenWeights:
        return TokenWeights(loss_weight=batch.logprobs.exp() ** gamma)

    assert rule_params("square") == {"gamma": 2.0}
    # w(p) = p^2 at p = 0, .5, 1
    torch.testing.assert_close(_t(weight_curve("square", n=3)["w"]), _t([0.0, 0.25, 1.0]))
    with pytest.raises(ValueError, match="already registered"):
        register_weighting("square")(square)


def test_grpo_has_no_effect():
    w = get_weighting("grpo")(_prob_batch([0.1, 0.9]))
    assert w == TokenWeights()
    assert w.effective(torch.zeros(1, 2)).tolist() == [[1.0, 1.0]]


def test_tr_grpo_hand_values():
    # w = clip(2 (sigmoid(9p) - 0.25), 1, 1.4):
    # p .05: sigmoid(.45) = .6106392 -> 2 * .3606392 = .7212785 -> clipped up to 1
    # p .15: sigmoid(1.35) = .7941296 -> 2 * .5441296 = 1.0882593
    # p .2 : sigmoid(1.8) = .8581489 -> 1.2162979
    # p .5 : sigmoid(4.5) = .9890131 -> 1.4780261 -> clipped down to 1.4
    w = get_weighting("tr_grpo")(_prob_batch([0.05, 0.15, 0.2, 0.5]))
    assert w.ratio_weight is None and w.advantage_weight is None
    torch.testing.assert_close(w.loss_weight, _t([[1.0, 1.0882593, 1.2162979, 1.4]]), atol=1e-7, rtol=0)
    r = get_weighting("tr_grpo")(_prob_batch([0.05, 0.15, 0.2, 0.5]), placement="ratio")
    assert r.loss_weight is None
    torch.testing.assert_close(r.ratio_weight, w.loss_weight)
    with pytest.raises(ValueError, match=r"known placements: \['loss', 'ratio'\]"):
        get_weighting("tr_grpo")(_prob_batch([0.5]), placement="kl")


def test_tr_grpo_uses_current_not_old_probability():
    # p_theta = .2 -> 1.2162979 even though p_old = .9 would give 1.4
    w = get_weighting("tr_grpo")(_prob_batch([0.2], p_old=[0.9]))
    assert w.loss_weight.item() == pytest.approx(1.2162979, abs=1e-7)


def test_tr_grpo_default_weights_are_not_constant():
    # the preset with sigmoid(p / 9) would be constant 1 after the clip; sigmoid(9 p) must not be
    curve = weight_curve("tr_grpo", {})
    w = _t(curve["w"])
    assert curve["p"][0] == 0.0 and curve["p"][-1] == 1.0 and len(w) == 101
    assert w.min().item() == pytest.approx(1.0) and w.max().item() == pytest.approx(1.4)
    assert (w.diff() >= 0).all()  # monotone in p
    # strictly rising between ln(3)/9 = .122 and ln(19)/9 = .327
    assert len(set(w[13:32].tolist())) == 19


def test_tr_grpo_reverse_is_mirror_image():
    # evaluated at 1 - p: p .95 -> (.05) 1.0; p .8 -> (.2) 1.2162979; p .5 -> 1.4
    w = get_weighting("tr_grpo_reverse")(_prob_batch([0.95, 0.8, 0.5]))
    torch.testing.assert_close(w.loss_weight, _t([[1.0, 1.2162979, 1.4]]), atol=1e-7, rtol=0)
    fwd, rev = _t(weight_curve("tr_grpo")["w"]), _t(weight_curve("tr_grpo_reverse")["w"])
    torch.testing.assert_close(rev, fwd.flip(0))


def test_ar_hand_values_use_old_probability():
    # (0.3 p_old + 0.7): p_old .1 -> .73, .5 -> .85, 1 -> 1.0; current p is irrelevant
    w = get_weighting("ar")(_prob_batch([0.9, 0.9, 0.9], p_old=[0.1, 0.5, 1.0]))
    torch.testing.assert_close(w.advantage_weight, _t([[0.73, 0.85, 1.0]]))
    assert w.phases is None and w.loss_weight is None
    # alpha = 0.2: .2 * .5 + .8 = .9
    assert get_weighting("ar")(_prob_batch([0.5]), alpha=0.2).advantage_weight.item() == pytest.approx(0.9)
    torch.testing.assert_close(_t(weight_curve("ar", n=3)["w"]), _t([0.7, 0.85, 1.0]))
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        get_weighting("ar")(_prob_batch([0.5]), alpha=1.5)


def _lopti_batch():
    # p_old [[.2, .5, .7], [.49, .9, pad]]; eta .5, strict <: low = .2 and .49 (.5 itself is high)
    old = _t([[0.2, 0.5, 0.7], [0.49, 0.9, 0.01]]).log()
    mask = _t([[1, 1, 1], [1, 1, 0]])
    return TokenBatch(logprobs=old, old_logprobs=old, advantages=torch.ones(2, dtype=F64), mask=mask), mask


def test_lopti_phases_disjoint_cover_mask_low_first():
    batch, mask = _lopti_batch()
    low, high = get_weighting("lopti")(batch).phases
    assert low.tolist() == [[1, 0, 0], [1, 0, 0]]
    assert high.tolist() == [[0, 1, 1], [0, 1, 0]]
    assert (low * high).sum() == 0 and torch.equal(low + high, mask)
    first, second = get_weighting("lopti")(batch, eta=0.6, low_first=False).phases
    assert first.tolist() == [[0, 0, 1], [0, 1, 0]] and second.tolist() == [[1, 1, 0], [1, 0, 0]]


def test_ar_lopti_combines_both():
    batch, _ = _lopti_batch()
    w = get_weighting("ar_lopti")(batch)
    assert w.phases[0].tolist() == [[1, 0, 0], [1, 0, 0]]
    # .3 * .2 + .7 = .76, .3 * .5 + .7 = .85, .3 * .7 + .7 = .91 ; .3 * .49 + .7 = .847, .97
    torch.testing.assert_close(w.advantage_weight[:, :2], _t([[0.76, 0.85], [0.847, 0.97]]))


def _cov_batch():
    """lp [[-1, -2], [-3, -2]] (mean -2, centred [[1, 0], [-1, 0]]); A [2, 0] (mean 1, centred [1, -1]);
    c = [[1 * 1, 0 * 1], [-1 * -1, 0 * -1]] = [[1, 0], [1, 0]]. An extra padding column holds junk."""
    lp = _t([[-1, -2, -40], [-3, -2, 0]])
    mask = _t([[1, 1, 0], [1, 1, 0]])
    return TokenBatch(logprobs=lp, old_logprobs=lp, advantages=_t([2, 0]), mask=mask)


def test_cw_grpo_hand_values():
    # c = [1, 0, 1, 0], mean .5, population var .25 -> w = exp(-c^2 / (2 * .25)) = [e^-2, 1, e^-2, 1];
    # renormalised to mean 1: e^-2 * 4 / (2 e^-2 + 2) = 2 / (e^2 + 1) = .2384058, 2 / (1 + e^-2) = 1.7615942
    w = get_weighting("cw_grpo")(_cov_batch()).advantage_weight
    lo, hi = 2 / (math.e**2 + 1), 2 / (1 + math.exp(-2))
    torch.testing.assert_close(w, _t([[lo, hi, 1.0], [lo, hi, 1.0]]))  # padding stays neutral


def test_cw_grpo_mean_one_and_degenerate_batch():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(6, 9, generator=g, dtype=F64) * 4
    mask = (torch.rand(6, 9, generator=g) > 0.3).to(F64)
    w = get_weighting("cw_grpo")(
        TokenBatch(logprobs=lp, old_logprobs=lp, advantages=torch.randn(6, generator=g, dtype=F64), mask=mask)
    ).advantage_weight
    assert w[mask > 0].mean().item() == pytest.approx(1.0, abs=1e-12)
    assert w[mask > 0].std().item() > 0.05  # a real batch is actually reweighted
    # equal advantages -> every c is 0, sigma 0 -> all weights 1 instead of 0/0
    flat = get_weighting("cw_grpo")(
        TokenBatch(logprobs=lp, old_logprobs=lp, advantages=torch.ones(6, dtype=F64), mask=mask)
    ).advantage_weight
    assert torch.equal(flat, torch.ones_like(flat))


def _clip_cov_batch():
    """lp [[-1, -3], [-3, -1]] (mean -2, centred [[1, -1], [-1, 1]]); A [2, -2] (mean 0, centred [2, -2]);
    c = [[1 * 2, -1 * 2], [-1 * -2, 1 * -2]] = [[2, -2], [2, -2]]; candidates (1 < c < 5): (0, 0), (1, 0)."""
    lp = _t([[-1, -3, 0], [-3, -1, 0]])
    mask = _t([[1, 1, 0], [1, 1, 0]])
    return lp, mask


def test_clip_cov_hand_selection():
    lp, mask = _clip_cov_batch()
    batch = TokenBatch(logprobs=lp, old_logprobs=lp, advantages=_t([2, -2]), mask=mask)
    # default r = 2e-4: floor(2e-4 * 4) = 0 -> at least 1 token zeroed, one of the two candidates
    w = get_weighting("clip_cov")(batch, seed=0).loss_weight
    assert w.sum().item() == 5.0 and w[:, 1:].eq(1).all() and w[:, 0].sum().item() == 1.0
    # r = 1: floor(4) = 4 picks, but only 2 candidates -> both zeroed
    assert get_weighting("clip_cov")(batch, fraction=1.0).loss_weight.tolist() == [[0, 1, 1], [0, 1, 1]]
    # omega_high = 2: no c strictly inside (1, 2) -> nothing zeroed
    assert get_weighting("clip_cov")(batch, fraction=1.0, cov_high=2.0).loss_weight.eq(1).all()


def test_clip_cov_excludes_already_clipped_tokens():
    lp, mask = _clip_cov_batch()
    old = lp.clone()
    old[0, 0] = lp[0, 0] - math.log(1.5)  # r = 1.5 with A = +2 > 0: above 1.2, PPO already clipped it
    batch = TokenBatch(logprobs=lp, old_logprobs=old, advantages=_t([2, -2]), mask=mask)
    assert get_weighting("clip_cov")(batch, fraction=1.0).loss_weight.tolist() == [[1, 1, 1], [0, 1, 1]]
    # with the authors' clip range 1.0 it is not clipped and is a candidate again
    both = get_weighting("clip_cov")(batch, fraction=1.0, eps_high=1.0).loss_weight
    assert both.tolist() == [[0, 1, 1], [0, 1, 1]]


def test_clip_cov_zeroes_exactly_the_selected_count_and_is_seeded():
    g = torch.Generator().manual_seed(3)
    lp = -torch.rand(16, 64, generator=g, dtype=F64) * 6
    adv = torch.randn(16, generator=g, dtype=F64) * 3
    mask = (torch.rand(16, 64, generator=g) > 0.2).to(F64)
    batch = TokenBatch(logprobs=lp, old_logprobs=lp, advantages=adv, mask=mask)
    cov = weighting._token_covariance(batch)
    cand = (mask > 0) & (cov > 1) & (cov < 5)
    fraction = 0.02
    expected = min(max(int(fraction * mask.sum().item()), 1), int(cand.sum()))
    assert 1 < expected < cand.sum()  # the draw is a strict subset
    w = get_weighting("clip_cov")(batch, fraction=fraction, seed=7).loss_weight
    assert int((w == 0).sum()) == expected
    assert cand[w == 0].all()  # only candidates are zeroed
    again = get_weighting("clip_cov")(batch, fraction=fraction, generator=torch.Generator().manual_seed(7))
    assert torch.equal(again.loss_weight, w)
    other = get_weighting("clip_cov")(batch, fraction=fraction, seed=8).loss_weight
    assert not torch.equal(other, w)


def test_kl_cov_top_k_and_penalty_only_there():
    # lp [[-.5, -2.5], [-3, -2]] mean -2 -> centred [[1.5, -.5], [-1, 0]]; A [2, -2] centred [2, -2]
    # c = [[3, -1], [2, 0]]; top-1 = (0, 0), top-2 = (0, 0) and (1, 0). Padding column holds junk.
    lp = _t([[-0.5, -2.5, 5.0], [-3, -2, 9.0]])
    mask = _t([[1, 1, 0], [1, 1, 0]])
    batch = TokenBatch(logprobs=lp, old_logprobs=lp, advantages=_t([2, -2]), mask=mask)
    assert get_weighting("kl_cov")(batch).kl_cov_coef.tolist() == [
        [1, 0, 0],
        [0, 0, 0],
    ]  # max(floor(.008), 1)
    w = get_weighting("kl_cov")(batch, fraction=0.5, kl_cov_coef=0.5)
    assert w.kl_cov_coef.tolist() == [[0.5, 0, 0], [0.5, 0, 0]]
    # in the loss: |log r| = 0.1 everywhere, so the penalty adds 0.5 * 0.1 = 0.05 on the top-k tokens only
    old = lp - 0.1
    plain = policy_loss(lp, old, batch.advantages, mask).per_token_loss
    cov = policy_loss(lp, old, batch.advantages, mask, w).per_token_loss
    torch.testing.assert_close(cov - plain, _t([[0.05, 0, 0], [0.05, 0, 0]]))


def test_effective_weight_is_product():
    w = TokenWeights(
        loss_weight=_t([[2.0]]),
        ratio_weight=_t([[3.0]]),
        advantage_weight=_t([[0.5]]),
        kl_cov_coef=_t([[7.0]]),
    )
    assert w.effective().item() == 3.0  # 2 * 3 * .5; the KL-Cov coefficient is not a weight
    assert TokenWeights().effective().item() == 1.0


def test_weight_curve_none_for_batch_dependent_rules():
    for name in ["cw_grpo", "clip_cov", "kl_cov"]:
        assert weight_curve(name) is None


def test_token_batch_boundary_checks():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"logprobs=\[2, 3\], old_logprobs=\[2, 4\]"):
        TokenBatch(
            logprobs=lp, old_logprobs=torch.zeros(2, 4), advantages=torch.zeros(2), mask=torch.ones(2, 3)
        )
    with pytest.raises(ValueError, match="advantages"):
        TokenBatch(logprobs=lp, old_logprobs=lp, advantages=torch.zeros(3), mask=torch.ones(2, 3))
    bad = lp.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(ValueError, match="logprobs has NaN"):
        TokenBatch(logprobs=bad, old_logprobs=lp, advantages=torch.zeros(2), mask=torch.ones(2, 3))
    # NaN outside the mask is fine; bf16 is promoted, grads are cut, [N] advantages broadcast
    src = torch.zeros(2, 3, dtype=torch.bfloat16, requires_grad=True)
    b = TokenBatch(
        logprobs=src,
        old_logprobs=lp,
        advantages=torch.tensor([1.0, 2.0]),
        mask=torch.tensor([[1, 1, 1], [1, 1, 0]]),
    )
    assert b.logprobs.dtype == torch.float32 and not b.logprobs.requires_grad
    assert b.advantages.tolist() == [[1, 1, 1], [2, 2, 2]] and b.mask.dtype == torch.float32
    TokenBatch(
        logprobs=bad, old_logprobs=lp, advantages=torch.zeros(2), mask=torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    )


@pytest.mark.parametrize("name", ALL_RULES)
def test_every_rule_runs_in_the_loss(name):
    g = torch.Generator().manual_seed(5)
    lp = (-torch.rand(4, 7, generator=g) * 3).requires_grad_()
    old = lp.detach() + 0.05 * torch.randn(4, 7, generator=g)
    adv = torch.randn(4, generator=g)
    mask = (torch.rand(4, 7, generator=g) > 0.2).float()
    w = get_weighting(name)(TokenBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask))
    out = policy_loss(lp, old, adv, mask, w)
    (grad,) = torch.autograd.grad(out.loss, lp)
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert w.effective(mask).shape == mask.shape


def test_what_the_built_in_rules_declare():
    fields = {name: get_weighting(name).fields() for name in ALL_RULES}
    assert fields["lopti"] == ("phases",) and fields["ar_lopti"] == ("advantage_weight", "phases")
    assert fields["kl_cov"] == ("kl_cov_coef",) and fields["tr_grpo"] == ("loss_weight",)
    assert get_weighting("tr_grpo").fields({"placement": "ratio"}) == ("ratio_weight",)
    assert [n for n in ALL_RULES if get_weighting(n).has_phases()] == ["ar_lopti", "lopti"]
    assert [n for n in ALL_RULES if not get_weighting(n).pointwise] == ["clip_cov", "cw_grpo", "kl_cov"]
    assert [n for n in ALL_RULES if not get_weighting(n).ppo_clip] == ["kl_cov"]
    with pytest.raises(ValueError, match=r"known placements: \['loss', 'ratio'\]"):
        get_weighting("tr_grpo").fields({"placement": "kl"})


def test_each_declaration_matches_what_the_rule_returns():
    """Every rule on a batch with both sides of Lopti's eta returns exactly the fields it declares."""
    lp = _t([[0.05, 0.3, 0.6, 0.95], [0.2, 0.5, 0.7, 0.9]]).log()
    batch = TokenBatch(
        logprobs=lp, old_logprobs=lp - 0.1, advantages=_t([1.0, -1.0]), mask=torch.ones(2, 4, dtype=F64)
    )
    for name in ALL_RULES:
        for params in ({}, {"placement": "ratio"}) if name.startswith("tr_grpo") else ({},):
            w = get_weighting(name)(batch, **params)
            returned = tuple(f for f in FIELDS if getattr(w, f) is not None)
            assert returned == get_weighting(name).fields(params), (name, params)


def test_an_undeclared_field_is_stopped_at_the_call(no_square):
    @register_weighting("square")  # declares the gradient scales only, but returns phases
    def square(batch: TokenBatch) -> TokenWeights:
        return TokenWeights(loss_weight=batch.mask, phases=(batch.mask,))

    with pytest.raises(
        ValueError, match=r"'square' returned \['phases'\].*returns=\('loss_weight', 'phases'\)"
    ):
        get_weighting("square")(_prob_batch([0.5]))
    assert square(_prob_batch([0.5])).phases is not None  # the decorator returns the function itself
    with pytest.raises(ValueError, match=r"names no TokenWeights field \['phase'\]"):
        register_weighting("square_2", returns=("phase",))(square)


def test_capabilities_are_read_without_running_the_rule(no_square):
    from tokengrad.objective.gradient_scale import resolve_weighting, unsupported_fields

    @register_weighting("square", returns=("advantage_weight", "phases"))
    def square(batch: TokenBatch, gamma: float = 2.0) -> TokenWeights:
        raise AssertionError("a capability was found by running the rule")

    assert get_weighting("square").has_phases({"gamma": 3.0})
    assert unsupported_fields("square") == ["phases"]
    with pytest.raises(ValueError, match=r"phases \(extra update phases\).*rules that can: \['ar', "):
        resolve_weighting("square", {})
    with pytest.raises(ValueError, match=r"has no parameters \['tau'\]"):
        unsupported_fields("square", {"tau": 1.0})
