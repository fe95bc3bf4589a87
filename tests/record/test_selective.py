import pytest
import torch

from tokengrad.record.fused_logprobs import logprobs_with_stats
from tokengrad.record.stats import token_stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_values_and_gradient_match_log_softmax(dtype):
    torch.manual_seed(0)
    base = (torch.randn(3, 7, 50) * 3).to(dtype)
    ids = torch.randint(0, 50, (3, 7))
    w = torch.randn(3, 7)  # any upstream gradient
    z1 = base.clone().requires_grad_(True)
    lp, st = logprobs_with_stats(z1, ids, chunk_rows=3)  # several chunks per sequence
    (lp * w).sum().backward()
    z2 = base.clone().requires_grad_(True)
    ref = torch.log_softmax(z2.float(), -1).gather(-1, ids[..., None]).squeeze(-1)
    (ref * w).sum().backward()
    assert lp.dtype == torch.float32
    assert torch.allclose(lp, ref, atol=1e-5)
    assert torch.allclose(z1.grad.float(), z2.grad.float(), atol=1e-5 if dtype == torch.float32 else 1e-2)
    s = token_stats(base, ids)
    for a, b in zip(st, s):
        assert torch.allclose(a, b, atol=1e-5)


def test_extreme_logits_gradient_is_exact():
    z = torch.tensor([[[1e4, -1e4, 0.0, 1e4]]], requires_grad=True)
    lp, st = logprobs_with_stats(z, torch.tensor([[0]]))
    lp.sum().backward()
    # p = (1/2, 0, 0, 1/2): d log p_0 / dz = e_0 - p = (1/2, 0, 0, -1/2)
    assert torch.allclose(z.grad, torch.tensor([[[0.5, 0.0, 0.0, -0.5]]]), atol=1e-6)
    assert st.sum_p2.item() == pytest.approx(0.5) and lp.item() == pytest.approx(-0.693147, rel=1e-5)


def test_confident_tokens_match_float64():
    from test_stats import ONE_MINUS_P, confident_logits

    logits, unit, logp = confident_logits(ONE_MINUS_P, seed=1)
    ids = torch.zeros(1, len(ONE_MINUS_P), dtype=torch.long)
    lp, s = logprobs_with_stats(logits.requires_grad_(True), ids)
    torch.testing.assert_close(s.logit_grad_unit[0].double(), unit, rtol=2e-5, atol=0)
    torch.testing.assert_close(lp[0].detach().double(), logp, rtol=2e-5, atol=0)
    (g,) = torch.autograd.grad(lp.sum(), logits)  # e_y - p: the unit up to fp32 rounding of 1 - p
    torch.testing.assert_close(g[0].double().norm(dim=-1), unit, rtol=1e-3, atol=1e-7)
