import math

import pytest
import torch

from tokengrad import token_stats


def _reference(logits, ids):
    """Naive fp64 reference: log_softmax, entropy, sum p^2, and |d(-log p_y)/dz| by autograd."""
    z = logits.double().detach().requires_grad_(True)
    logp = torch.log_softmax(z, -1)
    lp = logp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    ent = -(p * logp).sum(-1)
    s2 = (p * p).sum(-1)
    unit = torch.zeros_like(lp)
    for n in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            (g,) = torch.autograd.grad(-lp[n, t], z, retain_graph=True)
            unit[n, t] = g[n, t].norm()
    return lp.detach(), ent.detach(), s2.detach(), unit


def test_matches_autograd_reference():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 40) * 4
    ids = torch.randint(0, 40, (3, 5))
    s = token_stats(logits, ids, chunk_rows=2)  # several chunks per sequence
    lp, ent, s2, unit = _reference(logits, ids)
    for got, ref in [(s.logprob, lp), (s.entropy, ent), (s.sum_p2, s2), (s.logit_grad_unit, unit)]:
        assert torch.allclose(got.double(), ref, rtol=1e-4, atol=1e-5)
    assert torch.allclose(s.prob.double(), lp.exp(), rtol=1e-4)


def test_hand_computed_two_token_vocab():
    # logits (0, ln 3): p = (1/4, 3/4). Token 0: p_y = .25, sum p^2 = 1/16 + 9/16 = 10/16,
    # unit = sqrt(1 - 2*.25 + .625) = sqrt(1.125); entropy = -(.25 ln .25 + .75 ln .75) = 0.562335
    logits = torch.tensor([[[0.0, math.log(3.0)]]])
    s = token_stats(logits, torch.tensor([[0]]))
    assert s.prob.item() == pytest.approx(0.25, rel=1e-6)
    assert s.sum_p2.item() == pytest.approx(0.625, rel=1e-6)
    assert s.logit_grad_unit.item() == pytest.approx(math.sqrt(1.125), rel=1e-6)
    assert s.entropy.item() == pytest.approx(0.5623351446, rel=1e-5)


def test_extreme_logits_are_finite_and_exact():
    logits = torch.tensor([[[1e4, -1e4, 0.0, 1e4], [-1e4, -1e4, -1e4, 5.0]]])
    ids = torch.tensor([[1, 3]])
    s = token_stats(logits, ids)
    for t in s:
        assert torch.isfinite(t).all()
    # token 1 at row 0: p = 0 (e^-2e4), the two 1e4 tokens share the mass: sum p^2 = 1/2, unit = sqrt(1.5)
    assert s.prob[0, 0].item() == 0.0
    assert s.sum_p2[0, 0].item() == pytest.approx(0.5, rel=1e-6)
    assert s.logit_grad_unit[0, 0].item() == pytest.approx(math.sqrt(1.5), rel=1e-6)
    assert s.entropy[0, 0].item() == pytest.approx(math.log(2), rel=1e-5)
    # row 1: token 3 is certain: p = 1, unit = 0, entropy 0
    assert s.prob[0, 1].item() == pytest.approx(1.0)
    assert s.logit_grad_unit[0, 1].item() == pytest.approx(0.0, abs=1e-3)


def test_neg_inf_logits():
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]])
    s = token_stats(logits, torch.tensor([[0]]))
    assert s.prob.item() == pytest.approx(0.5)
    assert s.entropy.item() == pytest.approx(math.log(2), rel=1e-6)


def test_large_vocab_bf16_and_masked_rows():
    torch.manual_seed(1)
    V = 150_000
    logits = (torch.randn(2, 3, V) * 2).to(torch.bfloat16)
    ids = torch.randint(0, V, (2, 3))
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])  # second row fully masked
    s = token_stats(logits, ids, mask)
    ref = torch.log_softmax(logits.float().double(), -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(s.logprob[0, :2].double(), ref[0, :2], rtol=1e-4)
    assert (s.logprob[1] == 0).all() and (s.logit_grad_unit[1] == 0).all()
    for t in s:
        assert torch.isfinite(t).all()


def test_bad_shapes_name_the_tensors():
    with pytest.raises(ValueError, match="token_ids shape"):
        token_stats(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logits must be \[N, T, V\]"):
        token_stats(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="mask shape"):
        token_stats(torch.randn(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), torch.ones(3, 2))


def confident_logits(one_minus_p, V=500, seed=0):
    """[1, len(one_minus_p), V] fp32 logits whose token 0 has probability 1 - q for each q (the other
    logits random), with the float64 reference |p - e_y| and log p of those very fp32 logits."""
    g = torch.Generator().manual_seed(seed)
    rest = torch.randn(len(one_minus_p), V - 1, generator=g)  # [T, V-1]
    q = torch.tensor(one_minus_p, dtype=torch.float64)  # [T]
    # p_0 = 1 / (1 + R e^-z0) with R = sum_j e^{z_j}: 1 - p_0 = q  <=>  z0 = log R + log((1 - q) / q)
    z0 = rest.double().exp().sum(-1).log() + torch.log1p(-q) - q.log()  # [T]
    logits = torch.cat([z0.float()[:, None], rest], 1)[None]  # [1, T, V]
    p = torch.softmax(logits.double(), -1)[0]  # [T, V] of the fp32 logits, in float64
    grad = p.clone()
    grad[:, 0] -= 1.0  # p - e_y, and p_0 - 1 is exact in float64 to ~1e-16
    return logits, grad.norm(dim=-1), torch.log_softmax(logits.double(), -1)[0, :, 0]


ONE_MINUS_P = [0.5, 1e-2, 2.4e-4, 3.5e-5, 1e-5, 1e-6, 1e-7]


def test_confident_tokens_match_float64():
    # sqrt(1 - 2p + sum p^2) in fp32 is off by +45 % at 1 - p = 2.4e-4 and exactly 0 below 3.5e-5
    logits, unit, logp = confident_logits(ONE_MINUS_P)
    ids = torch.zeros(1, len(ONE_MINUS_P), dtype=torch.long)
    s = token_stats(logits, ids)
    torch.testing.assert_close(s.logit_grad_unit[0].double(), unit, rtol=2e-5, atol=0)
    torch.testing.assert_close(s.logprob[0].double(), logp, rtol=2e-5, atol=0)  # log p ~ -(1 - p) here
    q = -torch.expm1(logp)  # 1 - p; Prop 4.2's bounds: (1 - p) sqrt(V/(V-1)) <= |p - e_y| <= sqrt 2 (1 - p)
    assert ((unit / q > 1.0) & (unit / q < 2**0.5)).all()
