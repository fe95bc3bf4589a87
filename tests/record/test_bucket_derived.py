"""The derived bucket (g minus the other buckets' gradients, on a residual-free update) against its own
backward pass: the same norm, share and cosine to 1e-5 relative with one pass fewer; and the cases where
no bucket may be derived (a residual term, gradients already present, a later pass with a residual)."""

import math

import pytest
import torch
from conftest import forward_logprobs, make_model

from tokengrad import Recorder, load_run
from tokengrad.record import Buckets
from tokengrad.record.buckets import analysis as bk

EDGES = (0.0, 0.015, 0.016, 1.0)  # a random tiny model puts p ~ 1/64: three buckets with tokens


def _loss(lp, logits, adv, mask, entropy_coef=0.0):
    loss = -(lp * adv[:, None] * mask).sum() / mask.sum()
    if entropy_coef:  # a term not built on log pi: the residual
        ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)  # [N, T]
        loss = loss - entropy_coef * (ent * mask).sum() / mask.sum()
    return loss


def _run(tmp_path, name, batch, monkeypatch, halves=1, entropy=(0.0, 0.0), pre_grad=False, direct=False):
    """Bucket rows of one update over `halves` passes and the number of bucket backward passes."""
    ids, mask, adv = batch
    model = make_model(seed=7)
    if pre_grad:  # gradients left from before the update: g holds more than its passes
        for p in model.parameters():
            p.grad = torch.full_like(p, 1e-3)
    if direct:
        monkeypatch.setattr(bk, "residual_free", lambda loss, lps: False)
    calls = []
    grad = torch.autograd.grad
    monkeypatch.setattr(torch.autograd, "grad", lambda *a, **k: calls.append(1) or grad(*a, **k))
    rows = torch.arange(4).chunk(halves)
    with Recorder(tmp_path / name, model=model, buckets=Buckets(every=1, edges=EDGES)) as rec:
        with rec.step(0) as st:
            for i, r in enumerate(rows):
                logits, lp, _, tgt = forward_logprobs(model, ids[r])
                st.track(lp, token_ids=tgt, mask=mask[r], advantages=adv[r], logits=logits, sample_ids=r)
                st.backward(_loss(lp, logits, adv[r], mask[r], entropy[i]))
            st.record_grad_norms()
    monkeypatch.undo()
    b = load_run(tmp_path / name).buckets
    return b.set_index("bucket"), len(calls)


@pytest.mark.parametrize("halves", [1, 2])  # one pass, and two passes accumulated into one update
def test_derived_bucket_equals_its_own_pass(tmp_path, batch, monkeypatch, halves):
    derived, n_derived = _run(tmp_path, "d", batch, monkeypatch, halves)
    direct, n_direct = _run(tmp_path, "p", batch, monkeypatch, halves, direct=True)
    active = int((direct.drop("residual").grad_norm > 0).sum())
    assert active == 3 and n_direct == halves * active and n_derived == halves * (active - 1)
    for col in ("grad_norm", "update_share", "cos_to_total", "n_tokens"):
        a, b = derived.drop("residual")[col], direct.drop("residual")[col]
        assert a.to_numpy() == pytest.approx(b.to_numpy(), rel=1e-5, abs=1e-9), col
    assert derived.loc["residual", "grad_norm"] == 0.0  # shown residual-free: exactly none
    assert direct.loc["residual", "grad_norm"] < 1e-6 * direct.drop("residual").grad_norm.max()


def test_no_bucket_is_derived_with_a_residual_or_earlier_gradients(tmp_path, batch, monkeypatch):
    ent, n_ent = _run(tmp_path, "e", batch, monkeypatch, entropy=(0.5, 0.0))
    assert n_ent == 3 and ent.loc["residual", "grad_norm"] > 1e-3  # every bucket has its pass
    _, n_pre = _run(tmp_path, "g", batch, monkeypatch, pre_grad=True)
    assert n_pre == 3


def test_a_later_pass_with_a_residual_leaves_the_derived_bucket_unknown(tmp_path, batch, monkeypatch):
    rows, n = _run(tmp_path, "l", batch, monkeypatch, halves=2, entropy=(0.0, 0.5))
    assert n == 2 + 2  # the derived bucket has no pass in either: its sum is unknown once g has a residual
    nan = rows.drop("residual").grad_norm.isna()
    assert int(nan.sum()) == 1 and math.isnan(rows.loc["residual", "grad_norm"])
    assert (rows.drop("residual")[~nan].grad_norm > 0).all()


def test_residual_free_walks_around_the_logprobs():
    w = torch.nn.Parameter(torch.randn(3, 5))
    x = torch.randn(2, 5)
    logits = x @ w.T  # [2, 3]
    lp = torch.log_softmax(logits, -1)[:, 0]  # [2]
    assert bk.residual_free((lp * 2).sum(), [lp])
    assert not bk.residual_free((lp * 2).sum() + logits.pow(2).sum(), [lp])  # a path around lp
    assert not bk.residual_free((lp * 2).sum() + 1e-3 * w.pow(2).sum(), [lp])  # straight to w
    assert not bk.residual_free(lp.detach().sum(), [lp])  # no graph: nothing shown


def test_shares_of_a_derived_bucket_by_hand():
    g1, g2, g3 = torch.tensor([3.0, 0.0]), torch.tensor([1.0, 2.0]), torch.tensor([0.0, -1.0])
    total = [g1 + g2 + g3]  # [4, 1]: |g|^2 = 17
    out = bk.bucket_shares([[g1], None, [g3]], total, derived=1)
    assert out["grad_norm"] == pytest.approx([3.0, math.sqrt(5.0), 1.0])
    assert out["update_share"] == pytest.approx([12 / 17, 6 / 17, -1 / 17])
    assert out["cos_to_total"][1] == pytest.approx(6 / (math.sqrt(5) * math.sqrt(17)))
    assert out["residual_grad_norm"] == 0.0 and out["residual_share"] == pytest.approx(0.0, abs=1e-12)
    plain = bk.bucket_shares([[g1], None, [g3]], total)  # not derived: bucket 1 empty, g2 the residual
    assert plain["grad_norm"][1] == 0.0 and plain["residual_grad_norm"] == pytest.approx(math.sqrt(5.0))
    with pytest.raises(ValueError, match="derived"):
        bk.bucket_shares([[g1], [g2], [g3]], total, derived=1)


def test_a_backward_outside_st_backward_leaves_the_derived_bucket_unknown(tmp_path, batch):
    ids, mask, adv = batch
    model = make_model(seed=7)
    with Recorder(tmp_path / "f", model=model, buckets=Buckets(every=1, edges=EDGES)) as rec:
        with rec.step(0) as st:
            logits, lp, _, tgt = forward_logprobs(model, ids)
            st.track(lp, token_ids=tgt, mask=mask, advantages=adv, logits=logits)
            st.backward(_loss(lp, logits, adv, mask))
            (1e-3 * sum(p.pow(2).sum() for p in model.parameters())).backward()  # not seen by the passes
            st.record_grad_norms()
    rows = load_run(tmp_path / "f").buckets.set_index("bucket")
    assert int(rows.drop("residual").grad_norm.isna().sum()) == 1
    assert math.isnan(rows.loc["residual", "update_share"])
