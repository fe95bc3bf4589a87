"""policy_loss against hand-computed values and a hand-written gradient formula."""

import math

import pytest
import torch

from tokengrad.objective.loss import AGGREGATIONS, k3_kl, phase_masks, policy_loss
from tokengrad.objective.weighting import TokenBatch, TokenWeights, get_weighting

F64 = torch.float64


def _one_token(ratio: float, adv: float):
    """A [1, 1] batch whose token has the given ratio r = exp(lp - old) and advantage."""
    old = torch.tensor([[math.log(0.5)]], dtype=F64)
    lp = (old + math.log(ratio)).requires_grad_()
    return lp, old, torch.tensor([adv], dtype=F64), torch.ones(1, 1, dtype=F64)


# (ratio, advantage, eps_low, eps_high, expected loss, expected clipped, expected dL/dlp)
# loss = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A); unclipped gradient = -A r, clipped 0.
CLIP_CASES = [
    # A > 0, r inside [0.8, 1.2]: -min(1.1, 1.1) = -1.1, grad -1 * 1.1
    (1.1, 1.0, 0.2, 0.2, -1.1, False, -1.1),
    # A > 0, r above: -min(1.5, 1.2) = -1.2, the constant branch wins -> clipped, grad 0
    (1.5, 1.0, 0.2, 0.2, -1.2, True, 0.0),
    # A > 0, r below: -min(0.5, 0.8) = -0.5, not clipped (a low ratio keeps its push up), grad -0.5
    (0.5, 1.0, 0.2, 0.2, -0.5, False, -0.5),
    # A < 0, r above: -min(-1.5, -1.2) = 1.5, not clipped, grad -(-1) * 1.5 = 1.5
    (1.5, -1.0, 0.2, 0.2, 1.5, False, 1.5),
    # A < 0, r below: -min(-0.5, -0.8) = 0.8, clipped, grad 0
    (0.5, -1.0, 0.2, 0.2, 0.8, True, 0.0),
    # A < 0, r inside: -min(-0.9, -0.9) = 0.9, grad 0.9
    (0.9, -1.0, 0.2, 0.2, 0.9, False, 0.9),
    # A = 2, r = 1.25, asymmetric eps_high 0.28: 1.25 < 1.28 so -min(2.5, 2.5) = -2.5, grad -2 * 1.25
    (1.25, 2.0, 0.2, 0.28, -2.5, False, -2.5),
    # same token with symmetric 0.2: -min(2.5, 1.2 * 2) = -2.4, clipped
    (1.25, 2.0, 0.2, 0.2, -2.4, True, 0.0),
    # A = -1, r = 0.85, asymmetric eps_low 0.1: lower bound 0.9, -min(-0.85, -0.9) = 0.9, clipped
    (0.85, -1.0, 0.1, 0.28, 0.9, True, 0.0),
    # A = 0: loss 0, nothing clipped
    (1.5, 0.0, 0.2, 0.2, 0.0, False, 0.0),
]


@pytest.mark.parametrize("ratio,adv,eps_low,eps_high,loss,clipped,grad", CLIP_CASES)
def test_clip_cases(ratio, adv, eps_low, eps_high, loss, clipped, grad):
    lp, old, a, m = _one_token(ratio, adv)
    out = policy_loss(lp, old, a, m, eps_low=eps_low, eps_high=eps_high)
    (g,) = torch.autograd.grad(out.loss, lp)
    assert out.loss.item() == pytest.approx(loss, abs=1e-12)
    assert out.clipped.item() is clipped
    assert out.ratio.item() == pytest.approx(ratio, abs=1e-12)
    assert g.item() == pytest.approx(grad, abs=1e-12)
    assert out.metrics["clip_frac"] == float(clipped)
    assert out.metrics["clip_frac_low"] == float(clipped and adv < 0)
    assert out.metrics["clip_frac_high"] == float(clipped and adv > 0)


def _aggregation_batch():
    """r = 1 everywhere, so the per-token loss is -A: [[-1, -2, pad], [-3, pad, pad]]."""
    lp = torch.tensor([[-1.0, -2.0, float("-inf")], [-0.5, float("nan"), 0.0]], dtype=F64, requires_grad=True)
    old = torch.where(torch.isfinite(lp.detach()), lp.detach(), 0.0)
    adv = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]], dtype=F64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=F64)
    return lp, old, adv, mask


@pytest.mark.parametrize(
    "aggregation,max_len,expected",
    [
        ("grpo", None, -2.25),  # sequence means (-1 - 2) / 2 = -1.5 and -3 / 1 = -3; mean -2.25
        ("dapo", None, -2.0),  # (-1 - 2 - 3) / 3 tokens
        ("dr_grpo", None, -1.0),  # -6 / (N * T) = -6 / (2 * 3)
        ("dr_grpo", 4, -0.75),  # -6 / (2 * 4)
    ],
)
def test_aggregations_hand_values_and_padding_is_inert(aggregation, max_len, expected):
    lp, old, adv, mask = _aggregation_batch()
    out = policy_loss(lp, old, adv, mask, aggregation=aggregation, max_len=max_len)
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert out.per_token_loss.tolist() == [[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]]
    (g,) = torch.autograd.grad(out.loss, lp)
    assert torch.isfinite(g).all() and g[mask == 0].abs().sum() == 0  # -inf/NaN padding gives no NaN grad
    assert sorted(AGGREGATIONS) == ["dapo", "dr_grpo", "grpo"]


def test_gradient_matches_hand_formula():
    """dL/dlp_t = m_t / n * [ -lw A aw u 1(not clipped) + beta (1 - exp(ref - lp)) + c sign(lp - old) ]
    for the dapo aggregation (n loss tokens), u = r * rw."""
    g = torch.Generator().manual_seed(0)
    n, t = 3, 5
    lp = (-torch.rand(n, t, generator=g, dtype=F64) * 2).requires_grad_()
    old = lp.detach() + 0.4 * torch.randn(n, t, generator=g, dtype=F64)  # ratios spread across the clip
    ref = lp.detach() + 0.3 * torch.randn(n, t, generator=g, dtype=F64)
    adv = torch.randn(n, generator=g, dtype=F64)
    mask = (torch.rand(n, t, generator=g) > 0.2).to(F64)
    lw, rw, aw = (0.5 + torch.rand(n, t, generator=g, dtype=F64) for _ in range(3))
    c = (torch.rand(n, t, generator=g) > 0.5).to(F64)
    w = TokenWeights(loss_weight=lw, ratio_weight=rw, advantage_weight=aw, kl_cov_coef=c)
    beta = 0.1
    out = policy_loss(
        lp, old, adv, mask, w, eps_low=0.2, eps_high=0.28, beta=beta, ref_logprobs=ref, aggregation="dapo"
    )
    (grad,) = torch.autograd.grad(out.loss, lp)
    lpd = lp.detach()
    u = (lpd - old).exp() * rw
    a = adv[:, None] * aw
    pg_grad = torch.where(out.clipped, 0.0, -lw * a * u)
    kl_grad = beta * (1 - (ref - lpd).exp())
    cov_grad = c * torch.sign(lpd - old)
    expected = mask * (pg_grad + kl_grad + cov_grad) / mask.sum()
    assert 0 < out.clipped.sum() < mask.sum()  # the batch exercises both branches
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def test_ratio_placement_vs_loss_placement():
    # w = 1.4, r = 1, A = +1, eps 0.2: ratio placement u = 1.4 -> -min(1.4, 1.2) = -1.2, clipped, grad 0;
    # loss placement: -1.4 * min(1, 1) = -1.4, grad -1.4 * 1 * 1 = -1.4.
    w = torch.full((1, 1), 1.4, dtype=F64)
    for adv, ratio_case, loss_case in [
        (1.0, (-1.2, 0.0), (-1.4, -1.4)),
        # A = -1: ratio placement -min(-1.4, -1.2) = 1.4, grad -(-1)(1.4) = 1.4
        (-1.0, (1.4, 1.4), (1.4, 1.4)),
    ]:
        for weights, (loss, grad) in [
            (TokenWeights(ratio_weight=w), ratio_case),
            (TokenWeights(loss_weight=w), loss_case),
        ]:
            lp, old, a, m = _one_token(1.0, adv)
            out = policy_loss(lp, old, a, m, weights)
            (g,) = torch.autograd.grad(out.loss, lp)
            assert (out.loss.item(), g.item()) == pytest.approx((loss, grad), abs=1e-12)


def test_k3_kl_value_and_gradient():
    # lp = log .5, ref = log .25: d = ref - lp = log .5 = -0.6931472; k3 = e^d - d - 1 = .5 + .6931472 - 1
    # = 0.1931472. A = 0, beta 0.1: loss 0.01931472; dL/dlp = beta (1 - e^d) = 0.1 * 0.5 = 0.05
    lp, old, a, m = _one_token(1.0, 0.0)
    ref = torch.tensor([[math.log(0.25)]], dtype=F64)
    out = policy_loss(lp, old, a, m, beta=0.1, ref_logprobs=ref)
    (g,) = torch.autograd.grad(out.loss, lp)
    assert out.kl.item() == pytest.approx(0.1931472, abs=1e-7)
    assert out.loss.item() == pytest.approx(0.01931472, abs=1e-8)
    assert g.item() == pytest.approx(0.05, abs=1e-12)
    assert out.metrics["kl_mean"] == pytest.approx(0.1931472, abs=1e-7)
    assert k3_kl(lp.detach(), lp.detach()).item() == 0.0  # identical policies -> 0


def test_kl_cov_penalty_value():
    # coefficient 1, r = 1.1, A = 0: loss = |log 1.1| = 0.0953102, grad = sign(log 1.1) = 1
    lp, old, a, m = _one_token(1.1, 0.0)
    out = policy_loss(lp, old, a, m, TokenWeights(kl_cov_coef=torch.ones(1, 1, dtype=F64)))
    (g,) = torch.autograd.grad(out.loss, lp)
    assert (out.loss.item(), g.item()) == pytest.approx((0.0953102, 1.0), abs=1e-7)


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_lopti_phases_with_full_loss_mask_sum_to_single_update(aggregation):
    # at the same parameters, the phase losses normalised by the full mask add up to the one-update loss
    g = torch.Generator().manual_seed(1)
    lp = -torch.rand(4, 6, generator=g, dtype=F64) * 3
    old = lp + 0.1 * torch.randn(4, 6, generator=g, dtype=F64)
    adv = torch.randn(4, generator=g, dtype=F64)
    mask = (torch.rand(4, 6, generator=g) > 0.3).to(F64)
    weights = get_weighting("lopti")(TokenBatch(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask))
    phases = phase_masks(weights, mask)
    assert len(phases) == 2
    total = sum(
        policy_loss(lp, old, adv, p, weights, loss_mask=mask, aggregation=aggregation).loss for p in phases
    )
    single = policy_loss(lp, old, adv, mask, aggregation=aggregation).loss
    assert total.item() == pytest.approx(single.item(), abs=1e-12)
    assert phase_masks(TokenWeights(), mask) == [mask]


def test_empty_mask_gives_zero_loss():
    lp, old, a, m = _one_token(1.3, 1.0)
    out = policy_loss(lp, old, a, torch.zeros_like(m))
    assert out.loss.item() == 0.0 and out.metrics["n_tokens"] == 0.0


def test_bad_inputs_raise_clear_errors():
    lp, old, adv, mask = _aggregation_batch()
    with pytest.raises(ValueError, match=r"old_logprobs=\[2, 2\]"):
        policy_loss(lp, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match=r"loss_weight=\[1, 3\]"):
        policy_loss(lp, old, adv, mask, TokenWeights(loss_weight=torch.ones(1, 3)))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, old, torch.ones(5), mask)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, old, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match=r"known aggregations: \['dapo', 'dr_grpo', 'grpo'\]"):
        policy_loss(lp, old, adv, mask, aggregation="token_mean")
    bad = old.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="old_logprobs has NaN"):
        policy_loss(lp, bad, adv, mask)
